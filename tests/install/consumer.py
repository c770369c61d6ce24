"""The Python twin of consumer.c, run by test_install.sh with the python of a venv into which
pip installed the package against the installed libchainps: declares a shaped tensor, pushes a
known gradient with SGD and checks the exact result."""
import os
import sys

import numpy as np

import chainps

print("chainps", chainps.__version__, "from", chainps.__file__, flush=True)
if not chainps.__file__.startswith(os.environ["CONSUMER_VENV"] + "/"):
    sys.exit(f"imported {chainps.__file__}, not the venv's package")
with chainps.init() as c:
    t = c.declare("consumer_py/w", (2, 3), init=chainps.Init.constant(1.0), optim=chainps.SGD(0.5))
    g = np.arange(6, dtype=np.float32)
    w = np.zeros(6, np.float32)
    c.push_pull(t, g, w)
    ok = t.shape == (2, 3) and (w == 1.0 - 0.5 * g).all()
print("python consumer ok" if ok else f"python consumer WRONG: {w}", flush=True)
sys.exit(0 if ok else 1)
