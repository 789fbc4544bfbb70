"""What the schema tests share: the validator, a check that prints ok or FAIL,
and a file's errors listed by path. Needs python3-jsonschema (Debian package);
importing it exits 77 (meson: skipped) without it."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("python3-jsonschema is not installed; skipping", file=sys.stderr)
    sys.exit(77)


def check(cond, what):
    if not cond:
        print("FAIL: " + what, file=sys.stderr)
        sys.exit(1)
    print("ok: " + what)


def load_validator(schema_path):
    with open(schema_path) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_file(validator, path):
    """Checks one JSON file against the schema and returns its document."""
    with open(path) as f:
        doc = json.load(f)
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    for e in errors:
        print(f"{path}: {'/'.join(map(str, e.path))}: {e.message}", file=sys.stderr)
    check(not errors, f"{path} matches the schema")
    return doc
