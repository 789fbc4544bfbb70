// The HTML report's stylesheet and scripts: plain CSS and JavaScript, no library.
#include "html_parts.hpp"

namespace cuboid::html {

const std::string_view kStyle = R"css(
body { font-family: "DejaVu Sans", Helvetica, Arial, sans-serif; font-size: 14px; color: #111; margin: 16px 24px; max-width: 1250px; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 26px 0 6px 0; border-bottom: 1px solid #ccc; padding-bottom: 3px; }
.subtitle { margin: 0 0 8px 0; color: #333; }
nav a { margin-right: 10px; color: #0b5394; }
pre { background: #f6f6f6; padding: 8px 10px; overflow-x: auto; font-size: 12px; line-height: 1.35; }
.caption, .note { color: #444; font-size: 13px; margin: 4px 0 8px 0; max-width: 1150px; }
.figure { overflow-x: auto; }
.pair { display: flex; flex-wrap: wrap; column-gap: 28px; align-items: flex-start; }
.pair > section { flex: 1 1 520px; min-width: 0; }
.figure svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 7px; border-bottom: 1px solid #e2e2e2; text-align: right; white-space: nowrap; }
td.note { text-align: left; }
th { background: #eef2f6; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[aria-sort="ascending"]::after { content: " \25B2"; font-size: 10px; }
th[aria-sort="descending"]::after { content: " \25BC"; font-size: 10px; }
tbody tr:nth-child(even) { background: #fafafa; }
tbody tr:hover { background: #fff5d6; }
#report-errors { color: #fff; background: #b00020; padding: 8px 8px 8px 28px; font-family: monospace; }
footer { margin-top: 30px; color: #666; font-size: 12px; }
@media print { nav { display: none; } th { position: static; } }
)css";

const std::string_view kErrorHook = R"js(
// Every script error, rejected promise and blocked request is listed on the
// page (#report-errors) and counted on <html data-errors>, so that a reader
// and the browser test both see it.
(function () {
  'use strict';
  var pending = [];
  function record(message) {
    var list = document.getElementById('report-errors');
    if (!list) { pending.push(message); return; }
    var item = document.createElement('li');
    item.textContent = message;
    list.appendChild(item);
    list.hidden = false;
    document.documentElement.setAttribute('data-errors', String(list.children.length));
  }
  window.addEventListener('error', function (e) {
    record('error: ' + (e.message || 'unknown') + (e.filename ? ' (' + e.filename + ':' + e.lineno + ')' : ''));
  });
  window.addEventListener('unhandledrejection', function (e) { record('unhandled rejection: ' + e.reason); });
  document.addEventListener('securitypolicyviolation', function (e) {
    record('blocked by the page\'s policy: ' + e.violatedDirective + ' ' + e.blockedURI);
  });
  document.addEventListener('DOMContentLoaded', function () { pending.splice(0).forEach(record); });
})();
)js";

const std::string_view kScript = R"js(
// Sortable tables (click a heading; again to reverse) and, with #selftest in
// the address, a check of the page that the browser test reads back.
(function () {
  'use strict';
  var each = function (list, f) { Array.prototype.forEach.call(list, f); };
  var tables = document.querySelectorAll('table.sortable');

  function value(row, col, numeric) {
    var c = row.cells[col];
    var v = c ? (c.hasAttribute('data-v') ? c.getAttribute('data-v') : c.textContent) : '';
    return numeric ? parseFloat(v) : v;
  }

  function arrange(table, key) {
    var body = table.tBodies[0];
    var keyed = Array.prototype.map.call(body.rows, function (r) { return { row: r, i: +r.getAttribute('data-i') }; });
    keyed.sort(function (a, b) { return key(a.row, b.row) || a.i - b.i; });
    keyed.forEach(function (k) { body.appendChild(k.row); });
  }

  function sortBy(table, col, descending) {
    var head = table.tHead.rows[0].cells;
    var numeric = head[col].getAttribute('data-type') === 'num';
    arrange(table, function (ra, rb) {
      var a = value(ra, col, numeric), b = value(rb, col, numeric);
      if (numeric && (isNaN(a) || isNaN(b))) return isNaN(a) - isNaN(b);  // blanks last either way
      var d = numeric ? a - b : (a < b ? -1 : a > b ? 1 : 0);
      return descending ? -d : d;
    });
    each(head, function (c) { c.removeAttribute('aria-sort'); });
    head[col].setAttribute('aria-sort', descending ? 'descending' : 'ascending');
  }

  function restore(table) {
    arrange(table, function () { return 0; });
    each(table.tHead.rows[0].cells, function (c) { c.removeAttribute('aria-sort'); });
  }

  each(tables, function (table) {
    each(table.tBodies[0].rows, function (r, i) { r.setAttribute('data-i', String(i)); });
    each(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      var toggle = function () { sortBy(table, col, th.getAttribute('aria-sort') === 'ascending'); };
      th.addEventListener('click', toggle);
      th.addEventListener('keydown', function (e) { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(); } });
    });
  });

  function selftest() {
    var out = { sections: {}, sorts: [], timeline: { blocks: 0, drawn: 0 } };
    each(['header', 'ranked', 'pareto', 'mesh', 'timeline', 'breakdown', 'explain'], function (id) {
      var el = document.getElementById(id);
      out.sections[id] = el ? Math.round(el.getBoundingClientRect().height) : -1;
    });
    each(tables, function (table) {
      each(table.tHead.rows[0].cells, function (th, col) {
        if (th.getAttribute('data-type') !== 'num') return;
        [true, false].forEach(function (descending) {
          sortBy(table, col, descending);
          out.sorts.push({ table: table.id, column: col, descending: descending,
                           values: Array.prototype.map.call(table.tBodies[0].rows, function (r) { return value(r, col, false); }) });
        });
      });
      restore(table);
    });
    each(document.querySelectorAll('#timeline-svg rect.tl-block'), function (r) {
      out.timeline.blocks += 1;
      if (r.getBBox().width > 0) out.timeline.drawn += 1;
    });
    var pre = document.createElement('pre');
    pre.id = 'report-selftest';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }

  if (window.location.hash === '#selftest') selftest();
  document.getElementById('report-status').setAttribute('data-state', 'ready');
})();
)js";

}  // namespace cuboid::html
