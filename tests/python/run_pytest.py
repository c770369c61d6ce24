#!/usr/bin/python3
"""Run one pytest file for ctest: exit 77 (ctest's skip) with a message when pytest, numpy or
torch is missing, and turn pytest's "no tests ran" (5) into a failure, never a silent pass."""
import importlib.util
import sys

missing = [m for m in ("pytest", "numpy", "torch") if importlib.util.find_spec(m) is None]
if missing:
    print(f"skipped: {', '.join(missing)} not installed for {sys.executable} "
          f"(apt-get install python3-pytest python3-numpy python3-torch)")
    sys.exit(77)
import pytest  # noqa: E402

rc = pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]])
sys.exit(1 if rc == 5 else int(rc))
