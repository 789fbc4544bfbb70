#!/usr/bin/env python3
"""The layer rule, checked by the compiler: each layer's code is built with the
CUBOID_LAYER_* macros of the layers it may use, and every public header of a
layer refuses to compile without its own macro. For one real source file of
each layer this takes the macros the build gives it (compile_commands.json),
checks them against the rule below, then compiles an include of every layer's
header with them: one above the layer must fail with the header's #error, one
it may use must compile."""
import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

# layer -> the layers its code may include (docs/architecture.md).
ALLOWED = {
    "core": ["core"],
    "cost": ["core", "cost"],
    "io": ["core", "cost", "io"],
    "sim": ["core", "cost", "sim"],
    "search": ["core", "cost", "sim", "search"],
    "report": ["core", "cost", "io", "sim", "search", "report"],
    "exec": ["core", "exec"],
    "run": ["core", "cost", "io", "exec"],
    "calibrate": ["core", "cost", "io", "exec", "calibrate"],
    "cli": ["core", "cost", "io", "sim", "search", "report", "exec", "calibrate"],
}
# The source file whose compile flags stand for each layer.
SOURCE = {
    "core": "src/core/plan.cpp",
    "cost": "src/cost/estimator.cpp",
    "io": "src/io/planfile.cpp",
    "sim": "src/sim/simulator.cpp",
    "search": "src/search/planner.cpp",
    "report": "src/report/report.cpp",
    "exec": "src/exec/backend.cpp",
    "run": "src/exec/run.cpp",
    "calibrate": "src/calibrate/calibrate.cpp",
    "cli": "src/cli/main.cpp",
}
# One public header per layer to include.
HEADER = {
    "core": "cuboid/core/plan.hpp",
    "cost": "cuboid/cost/estimator.hpp",
    "io": "cuboid/io/planfile.hpp",
    "sim": "cuboid/sim/simulator.hpp",
    "search": "cuboid/search/planner.hpp",
    "report": "cuboid/report/report.hpp",
    "exec": "cuboid/exec/backend.hpp",
    "calibrate": "cuboid/calibrate/calibrate.hpp",
}


def build_macros(build_dir):
    """layer -> the set of CUBOID_LAYER_* names the build compiles its SOURCE with."""
    commands = json.loads((build_dir / "compile_commands.json").read_text())
    macros = {}
    for layer, source in SOURCE.items():
        entry = next((c for c in commands if c["file"].endswith("../" + source) or c["file"].endswith("/" + source)), None)
        if entry is None:
            continue  # not built in this configuration (the executor needs MPI)
        words = shlex.split(entry["command"])
        macros[layer] = {w[len("-DCUBOID_LAYER_"):].lower() for w in words if w.startswith("-DCUBOID_LAYER_")}
    return macros


def compile_ok(cxx, root, macros, headers, workdir):
    src = Path(workdir) / "probe.cpp"
    src.write_text("".join(f'#include "{h}"\n' for h in headers) + "int main() { return 0; }\n")
    defines = [f"-DCUBOID_LAYER_{name.upper()}" for name in sorted(macros)]
    # -Wfatal-errors: a refused header stops at its #error, the first line it has.
    cmd = [*shlex.split(cxx), "-std=c++20", "-fsyntax-only", "-Wfatal-errors", f"-I{root / 'include'}", *defines, str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode == 0, r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cxx", required=True, help="the C++ compiler command (may start with ccache)")
    ap.add_argument("--root", required=True, type=Path, help="the source tree")
    ap.add_argument("--build", required=True, type=Path, help="the build directory (compile_commands.json)")
    args = ap.parse_args()
    failures = 0
    built = build_macros(args.build)
    if "core" not in built:
        print(f"FAIL: {SOURCE['core']} not found in {args.build / 'compile_commands.json'}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for layer, macros in built.items():
            allowed = ALLOWED[layer]
            if macros != set(allowed):
                print(f"FAIL {layer}: built with layers {sorted(macros)}, the rule says {sorted(allowed)}")
                failures += 1
            usable = [HEADER[name] for name in allowed if name in HEADER]
            ok, err = compile_ok(args.cxx, args.root, macros, usable, tmp)
            if not ok:
                print(f"FAIL {layer}: may include {', '.join(usable)} but they do not compile:\n{err}")
                failures += 1
            else:
                print(f"ok   {layer:<9} compiles {', '.join(usable)}")
            for target, header in HEADER.items():
                if target in allowed:
                    continue
                ok, err = compile_ok(args.cxx, args.root, macros, [header], tmp)
                if ok or "is not below this layer" not in err:
                    print(f"FAIL {layer}: includes {header} ({target}) and the build does not refuse it")
                    failures += 1
                else:
                    print(f"ok   {layer:<9} refuses {header}")
    print(f"layer rule: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
