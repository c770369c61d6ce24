"""chainps for Python: push gradients and pull parameters of a chainps job.

    import chainps
    client = chainps.init()          # a scheduler or server role runs here, then exits 0
    w = client.declare("fc1.weight", (256, 784), init=chainps.Init.normal(0, 0.05, seed=1),
                       optim=chainps.Adam(1e-3))
    client.pull(w, weights)          # numpy float32 array or torch CPU tensor, no copy
    client.push_pull(w, grad, weights)
    client.close()

Buffers are any C-contiguous float32 buffer (numpy arrays, memoryview, array.array('f')) or
torch CPU float32 tensors; they are read and written in place, never copied. A wrong dtype or
device is a TypeError, a wrong length or a non-contiguous buffer a ValueError, each naming the
tensor. Every failure of the library is a chainps.Error with ``.code`` (a negative CPS_E...
value, also module constants here), ``.name`` and cps_strerror's text; timeouts are
chainps.TimeoutError (also a builtins.TimeoutError).

Blocking calls release the GIL while they wait and let Ctrl-C through (KeyboardInterrupt); the
interrupted operation finishes on its own in the background and its buffers are kept alive
until it has. A Client may be used from several threads (the library serialises calls); close
it when no other thread uses it. See chainps.torch for PyTorch training and chainps.checkpoint
to read checkpoints.
"""

from chainps import _chainps
from chainps._chainps import Error, Handle, Tensor, TimeoutError  # noqa: A004
from chainps._chainps import *  # noqa: F401,F403  (the CPS_E... constants)

__version__ = _chainps.version

__all__ = ["init", "Client", "Tensor", "Handle", "Error", "TimeoutError", "JobEnded", "Init",
           "SGD", "Momentum", "AdaGrad", "Adam", "RMSProp", "init_values", "__version__"]


class JobEnded(SystemExit):
    """The job ended before this worker could take part: the replacement of a worker that died
    in the job's last all-reduce, started after the others had finished and left. There is
    nothing left to do. It is a SystemExit with status 0, so a script that does not catch it ends
    cleanly (the job succeeded); one that must do more can catch it by name."""

    def __init__(self, message):
        super().__init__(0)
        self.message = message

    def __str__(self):
        return self.message

_INIT_KINDS = {"zeros": 0, "constant": 1, "uniform": 2, "normal": 3}
_OPTIM_KINDS = {"sgd": 0, "momentum": 1, "adagrad": 2, "adam": 3, "rmsprop": 4}


class Init:
    """How the servers initialise a tensor's values; element i depends only on (seed, i), so
    every replica, and ``init_values`` here, compute the same ones."""

    __slots__ = ("kind", "a", "b", "seed")

    def __init__(self, kind="zeros", a=0.0, b=0.0, seed=0):
        if kind not in _INIT_KINDS:
            raise ValueError(f"Init kind must be one of {sorted(_INIT_KINDS)}, not {kind!r}")
        if not 0 <= int(seed) < 2 ** 64:
            raise ValueError("Init seed must be in [0, 2**64)")
        self.kind, self.a, self.b, self.seed = kind, float(a), float(b), int(seed)

    @classmethod
    def zeros(cls):
        return cls("zeros")

    @classmethod
    def constant(cls, value):
        return cls("constant", value)

    @classmethod
    def uniform(cls, low, high, seed=0):
        return cls("uniform", low, high, seed)

    @classmethod
    def normal(cls, mean, std, seed=0):
        return cls("normal", mean, std, seed)

    def _spec(self):
        return (_INIT_KINDS[self.kind], self.a, self.b, self.seed)

    def __repr__(self):
        return f"Init({self.kind!r}, a={self.a}, b={self.b}, seed={self.seed})"


class _Optimizer:
    """A server-side optimizer description; the servers run it (0 means the default)."""

    kind = "sgd"

    def __init__(self, lr, weight_decay=0.0, momentum=0.0, nesterov=False, beta1=0.0,
                 beta2=0.0, eps=0.0, rho=0.0):
        self.lr, self.weight_decay, self.momentum = float(lr), float(weight_decay), float(momentum)
        self.nesterov, self.beta1, self.beta2 = bool(nesterov), float(beta1), float(beta2)
        self.eps, self.rho = float(eps), float(rho)

    def _spec(self):
        return (_OPTIM_KINDS[self.kind], self.lr, self.weight_decay, self.momentum,
                self.nesterov, self.beta1, self.beta2, self.eps, self.rho)

    def __repr__(self):
        fields = ", ".join(f"{k}={v}" for k, v in vars(self).items() if v)
        return f"{type(self).__name__}({fields})"


class SGD(_Optimizer):
    kind = "sgd"

    def __init__(self, lr, weight_decay=0.0):
        super().__init__(lr, weight_decay)


class Momentum(_Optimizer):
    kind = "momentum"

    def __init__(self, lr, momentum=0.9, nesterov=False, weight_decay=0.0):
        super().__init__(lr, weight_decay, momentum=momentum, nesterov=nesterov)


class AdaGrad(_Optimizer):
    kind = "adagrad"

    def __init__(self, lr, eps=0.0, weight_decay=0.0):
        super().__init__(lr, weight_decay, eps=eps)


class Adam(_Optimizer):
    kind = "adam"

    def __init__(self, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
        super().__init__(lr, weight_decay, beta1=beta1, beta2=beta2, eps=eps)


class RMSProp(_Optimizer):
    kind = "rmsprop"

    def __init__(self, lr, rho=0.9, eps=1e-8, weight_decay=0.0):
        super().__init__(lr, weight_decay, rho=rho, eps=eps)


def _init_spec(init):
    if init is None:
        return None
    if not isinstance(init, Init):
        raise TypeError(f"init must be a chainps.Init, not {type(init).__name__}")
    return init._spec()


def _optim_spec(optim):
    if optim is None:
        return None
    if not isinstance(optim, _Optimizer):
        raise TypeError(f"optim must be a chainps optimizer (SGD, Adam, ...), not "
                        f"{type(optim).__name__}")
    return optim._spec()


class Client(_chainps.Client):
    """A worker's membership of a job. ``Client()`` joins exactly like ``chainps.init()``.

    Properties: rank, num_workers, num_servers, mode ('sync', 'async', 'ssp'), staleness, closed.
    Calls: declare, declare_table, push, pull, push_pull (and *_async returning a Handle whose
    wait(timeout=None) raises on failure), rows_push, rows_pull, barrier, stats, close. Also a
    context manager that closes on exit.
    """

    def declare(self, name, shape, init=None, optim=None):
        """Declare a dense float32 tensor of `shape` (an int or up to 8 ints); every worker
        declares the same tensors. init: a chainps.Init (default zeros); optim: SGD(...),
        Adam(...), ... (default SGD(0.01)). Returns a chainps.Tensor. Raises chainps.Error
        (CPS_EEXIST: the job has this name with another shape or optimizer)."""
        return super().declare(name, shape, _init_spec(init), _optim_spec(optim))

    def declare_table(self, name, rows, cols, init=None, optim=None):
        """Declare an embedding table of rows x cols float32, for rows_push / rows_pull."""
        return super().declare_table(name, rows, cols, _init_spec(init), _optim_spec(optim))


def init():
    """Join the job the environment describes (CHAINPS_*, DMLC_* or MS_* variables, as
    cps_open). In a scheduler or server role this runs that role until the job ends and the
    process exits 0 (1 on a fatal error); in a worker role it returns a Client."""
    return Client()


def init_values(init, offset, n):
    """The values the servers give elements offset..offset+n-1 of a tensor declared with `init`,
    as a numpy float32 array (a single-process baseline can start where a job starts)."""
    import numpy as np

    return np.frombuffer(_chainps.init_values(_init_spec(init), int(offset), int(n)),
                         dtype=np.float32)
