"""Build the one-folder app with PyInstaller.

    python packaging/build.py [--dist DIR] [--work DIR] [--check]

Writes DIR/offload-planner/ (default DIR: dist/ at the top of the checkout): the executable,
`_internal/` and `share/` (desktop entry, AppStream metainfo, the .gguf MIME type, icons).
PyInstaller's build folder and its cache (PYINSTALLER_CONFIG_DIR) go to a temporary folder unless
--work is given, so a build leaves nothing behind but the bundle. --check runs the built app's
`--version` and a headless `inspect` of its demo model afterwards. Needs `pip install pyinstaller`
(in the test extra).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "packaging" / "offload-planner.spec"
NAME = "offload-planner"


def executable(bundle: Path) -> Path:
    """The console executable inside a built bundle folder."""
    return bundle / (f"{NAME}.exe" if sys.platform == "win32" else NAME)


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build(dist: Path, work: Path | None = None, *, quiet: bool = False) -> Path:
    """Run PyInstaller on the spec; return the bundle folder (dist/offload-planner)."""
    dist = dist.resolve()
    with tempfile.TemporaryDirectory(prefix="offload-planner-build-") as tmp:
        work_dir = (work or Path(tmp) / "work").resolve()
        env = dict(os.environ)
        # PyInstaller caches per user (~/.cache/pyinstaller); keep it with the build instead.
        env.setdefault("PYINSTALLER_CONFIG_DIR", str(work_dir / "cache"))
        cmd = [
            sys.executable, "-m", "PyInstaller", "--noconfirm",
            "--distpath", str(dist), "--workpath", str(work_dir),
            "--log-level", "WARN" if quiet else "INFO",
            str(SPEC),
        ]
        subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    bundle = dist / NAME
    if not executable(bundle).is_file():
        raise SystemExit(f"build finished but {executable(bundle)} is missing")
    return bundle


def check(bundle: Path) -> None:
    exe = str(executable(bundle))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    for args in (["--version"], ["inspect", "--no-layers"]):
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, env=env)
        print(f"$ {NAME} {' '.join(args)}  (exit {r.returncode})")
        print((r.stdout + r.stderr).rstrip())
        if r.returncode != 0:
            raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder (default: dist/)")
    p.add_argument("--work", type=Path, help="PyInstaller build folder (default: a temporary one)")
    p.add_argument("--check", action="store_true", help="run the built app's --version and inspect")
    p.add_argument("--quiet", action="store_true", help="only PyInstaller's warnings")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    bundle = build(args.dist, args.work, quiet=args.quiet)
    took = time.monotonic() - t0
    print(f"{bundle}: {folder_size(bundle) / 2**20:.0f} MiB, built in {took:.0f} s")
    if args.check:
        check(bundle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
