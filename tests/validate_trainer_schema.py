#!/usr/bin/env python3
"""Validates the trainer presets against schemas/cuboid.trainer.1.schema.json.

    validate_trainer_schema.py --schema SCHEMA --trainers DIR

Every DIR/*.json must match, and the schema must stay strict: it must reject an
unknown field, a setting without its source, a value of the wrong type, an
out-of-range number and an unknown enum value, so a test fails if it loosens.
Needs python3-jsonschema (Debian package); exits 77 (meson: skipped) without it.
"""
import argparse
import copy
import glob
import json
import os

from schema_check import check, load_validator, validate_file


def schema_is_strict(validator, doc):
    def rejects(what, change):
        bad = copy.deepcopy(doc)
        change(bad)
        check(not validator.is_valid(bad), "schema rejects " + what)

    rejects("an unknown top-level field", lambda d: d.update(not_a_field=1))
    rejects("an unknown setting", lambda d: d["settings"].update(fp8={"value": True, "source": "s"}))
    rejects("a capability under settings", lambda d: d["settings"].update(pipeline={"value": True, "source": "s"}))
    rejects("a setting without a source", lambda d: d["settings"]["dp_overlap"].pop("source"))
    rejects("a bare value", lambda d: d["settings"].update(dp_overlap=True))
    rejects("an empty source", lambda d: d["settings"]["dp_overlap"].update(source=" "))
    rejects("a boolean given as a number", lambda d: d["settings"]["dp_overlap"].update(value=1))
    rejects("a negative count", lambda d: d["settings"].update(zero3_persist_params={"value": -1, "source": "s"}))
    rejects("ZeRO stage 4", lambda d: d["can_run"].update(zero_stages={"value": [0, 4], "source": "s"}))
    rejects("an unknown ZeRO-3 unit", lambda d: d["settings"].update(zero3_unit={"value": "layer", "source": "s"}))
    rejects("3 bytes per gradient", lambda d: d["settings"]["dp_grad_bytes"].update(value=3))
    rejects("a missing required setting", lambda d: d["settings"].pop("dp_grad_bytes"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schema", required=True)
    ap.add_argument("--trainers", required=True, help="the trainers/ folder")
    args = ap.parse_args()

    validator = load_validator(args.schema)
    paths = sorted(glob.glob(os.path.join(args.trainers, "*.json")))
    check(len(paths) > 0, f"there are presets in {args.trainers}")
    for path in paths:
        doc = validate_file(validator, path)
        check(path.endswith("/" + doc["name"] + ".json"), f"{path} is named after its preset")
    with open(paths[0]) as f:
        schema_is_strict(validator, json.load(f))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
