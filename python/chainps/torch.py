"""PyTorch on chainps: the parameters live on the servers, the optimizer runs there.

In the convention of Horovod's and BytePS's ``DistributedOptimizer``::

    import chainps, chainps.torch
    client = chainps.init()                    # a scheduler or server role runs and exits here
    model = Net()
    opt = chainps.torch.DistributedOptimizer(model.named_parameters(), chainps.SGD(0.05),
                                             client=client)
    for step in range(opt.start_step, steps):  # a resumed job starts at its checkpoint's step
        opt.zero_grad()
        loss_fn(model(x), y).backward()        # each gradient is pushed as soon as it is ready
        opt.step()                             # waits for the new parameters, now in the model

Each parameter is declared under its ``named_parameters()`` name with its shape, so a checkpoint
of the job loads with ``model.load_state_dict(chainps.checkpoint.load(path))``. Pushes start
from gradient hooks during ``backward()``, so communication overlaps the rest of the backward
pass; ``step()`` waits for them. In sync mode the servers sum the workers' gradients (in rank
order: the run is deterministic), so each worker pushes its share of the mean (gradient / W);
in async and ssp:N modes each push is applied on its own, as it is.

Hybrid training (MindSpore's ``set_param_ps()``, BytePS): give ``local_optim`` (a function
taking a list of parameters and returning any ``torch.optim`` optimizer) and the parameters split
in two. Those ``on_servers`` picks (by default: embeddings, i.e. names containing "embed", and
tensors of ``server_threshold`` values or more) live on the servers as above; the rest are
all-reduced among the workers (``client.allreduce``, mean over the live workers, the same bits on
every worker) in ``step()`` and updated by the local optimizer on every worker. They start from
rank 0's values (a replacement of a dead worker: a live worker's, with its step). The
all-reduced parameters' storage moves into one flat buffer with the local optimizer's float32
state (``p.data`` and the state's tensors become views of it) and their gradients into another
(``p.grad`` views, which ``zero_grad`` zeroes in place): the all-reduce, the share to a
replacement of a dead worker (parameters and optimizer state) and the checkpoint listing read
them there, without a copy per step. The local optimizer's state layout is learnt from a copy
of it stepped once on zeros. A replacement that arrives when the other workers have already
finished the job without it (its predecessor died in the last all-reduce) has nothing to do: the
constructor closes the client, says so on stderr and raises ``chainps.JobEnded``, a
``SystemExit`` with status 0 (uncaught, the script ends cleanly; catch it by name to do more).
Without ``local_optim`` every parameter lives on the servers.

Initial values come from the servers (the first declaration creates them; every worker pulls
the same ones), drawn like torch's defaults for Linear and Conv layers: weights and their biases
uniform in +-1/sqrt(fan_in), other one-dimensional parameters constant at their local value when
it is constant (LayerNorm's 1 and 0), else zeros. Pass ``init=`` to choose per parameter.
"""

import copy
import hashlib
import json
import math
import os
import weakref

import torch

import chainps
from chainps import checkpoint as _ckpt

__all__ = ["DistributedOptimizer", "default_init", "default_on_servers", "load_state_dict"]


def _seed_of(name, seed):
    h = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def default_init(name, param, params, seed=0):
    """The chainps.Init a parameter gets by default (see the module's docstring).

    ``params`` maps names to every parameter, so a bias finds its weight's fan-in.
    """
    s = _seed_of(name, seed)
    if param.dim() >= 2:
        fan_in = param[0].numel()
        bound = 1.0 / fan_in ** 0.5
        return chainps.Init.uniform(-bound, bound, seed=s)
    if name.endswith("bias"):
        w = params.get(name[: -len("bias")] + "weight")
        if w is not None and w.dim() >= 2:
            bound = 1.0 / w[0].numel() ** 0.5
            return chainps.Init.uniform(-bound, bound, seed=s)
    flat = param.detach().reshape(-1)
    if flat.numel() and bool((flat == flat[0]).all()) and float(flat[0]) != 0.0:
        return chainps.Init.constant(float(flat[0]))
    return chainps.Init.zeros()


def _check_param(name, p):
    if p.dtype != torch.float32:
        raise TypeError(f"parameter {name}: chainps trains float32 parameters, not {p.dtype}")
    if p.device.type != "cpu":
        raise TypeError(f"parameter {name}: on {p.device}; chainps takes CPU tensors only")
    if not p.is_contiguous():
        raise ValueError(f"parameter {name}: not contiguous")


def _replacement_too_late(client):
    """The other workers finished the job without the worker we replace (it died in their last
    all-reduce) and left: nobody will all-reduce with us, and the job's work is done. Ending here
    with status 0 is the job's clean end; failing would fail a job that succeeded."""
    import sys
    rank = client.rank  # a closed client answers nothing, its rank included (ValueError)
    print(f"chainps.torch: rank {rank}: the job has ended (the other workers finished "
          "without this replacement); exiting", file=sys.stderr, flush=True)
    client.close()
    raise chainps.JobEnded(f"rank {rank}: the job has ended without this replacement")


class DistributedOptimizer:
    """Push every gradient of a model and bring back its new parameters, through chainps.

    Args:
        named_parameters: ``model.named_parameters()`` (or a list of (name, parameter)).
        optim: the server-side optimizer, e.g. ``chainps.Adam(1e-3)`` (default SGD 0.01).
        client: a ``chainps.Client`` (default: ``chainps.init()``).
        init: None for :func:`default_init`, a ``chainps.Init`` for every parameter, or a
            function (name, parameter) -> chainps.Init.
        seed: mixed into the default initial values' seeds.
        overlap: push from gradient hooks during backward() (default); False pushes everything
            in step(), one asynchronous push-pull per parameter (for comparison).
        prefix: prepended to every declared name (to train two models in one job).
        compress: lossy compression of the gradients pushed (client.compress): None (the
            job's default, CHAINPS_COMPRESS), a spec for every parameter ('fp16', 'bf16',
            'topk:R', 'none'), or a callable (name, param) -> spec or None, to choose per
            tensor (e.g. 'topk:0.01' for large weight matrices, None for biases).

        on_servers: hybrid mode only: which parameters live on the servers, as a collection of
            names or a predicate (name, param) -> bool (the model's names, without ``prefix``). Default: :func:`default_on_servers`.
        local_optim: hybrid mode: a callable (list of parameters) -> torch.optim.Optimizer for
            the all-reduced parameters. None (default): every parameter on the servers.
        server_threshold: the default placement's size, in values, from which a tensor goes to
            the servers.
        sparse: two-dimensional server parameters declared as tables whose gradients go as row
            pushes (client.rows_push of the rows the step touched, then rows_pull of them), not
            dense: names, or a predicate (name, param) -> bool. Default: in hybrid mode the
            embeddings on the servers, otherwise none. A torch sparse gradient
            (``nn.Embedding(sparse=True)``) gives its rows; a dense one its nonzero rows.
            Row pushes apply on arrival even in sync mode (no per-step aggregate).
        sync_every: talk to the servers and the ring once every k steps (gradient
            accumulation, not local SGD: the update is that of a k times larger batch, and the
            bytes pushed, pulled and all-reduced fall by k; a sparse table's pushes fall by k,
            its bytes by how often its rows come back within a window). All-reduced parameters (hybrid
            mode): their gradients are summed for k steps, all-reduced and the local optimizer
            stepped once every k, bitwise the same on every worker. Parameters on the servers:
            a dense tensor's gradients are summed locally and the window's mean (sum / k)
            push-pulled at every k-th step (the C API's CPS_FREQ_SERVERS); a sparse table's
            row gradients are summed by row index (duplicates added in step order, rows
            sorted) and go as one rows_push of the window's rows (sum / k), followed by one
            rows_pull of them. Nothing is pulled in between: in sync mode the servers'
            values change only when every worker's window push is in, so a pull at the other
            steps would bring the same bits (the model's parameters do not move inside a
            window, as the all-reduced ones do not). Windows end on the job's step (every
            k-th; for the all-reduced ones after the warm-up), not on this process's count,
            so a replacement worker syncs at the same steps as the others. This is the C
            API's cps_freq (``client.freq``), bounds included (1 .. 2**20).
        server_sync_every: the servers' parameters' k, when it should differ from
            ``sync_every`` (None, the default: the same k; 1: push every step, as before
            issue 29's server accumulation).
        warmup_steps: hybrid mode: for the first n steps each worker steps its local optimizer
            on its own gradients without talking to the others; at the first synchronisation
            the parameters and the local optimizer's state are averaged (all-reduce mean), so
            every worker continues from the same bits. The servers' parameters have no warm-up
            (there is one copy of them, on the servers: nothing to train apart and average):
            their windows of k run from the job's step 0, during the warm-up too.

    The constructor declares every parameter (with its shape) and pulls its values into the
    model, so every worker starts from the same parameters. Raises TypeError/ValueError for a
    parameter that is not a contiguous float32 CPU tensor, chainps.Error when a declaration is
    refused (e.g. CPS_EEXIST: the job has that name with another shape).
    """

    def __init__(self, named_parameters, optim=None, client=None, init=None, seed=0,
                 overlap=True, prefix="", compress=None, on_servers=None, local_optim=None,
                 server_threshold=1 << 16, sparse=None, sync_every=1, warmup_steps=0,
                 server_sync_every=None):
        self.client = client if client is not None else chainps.init()
        named = [(prefix + n, p) for n, p in named_parameters if p.requires_grad]
        if not named:
            raise ValueError("no parameters that require a gradient")
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("two parameters share a name")
        self._local = []
        # cps_freq's rules are the only ones: it refuses bad settings (ValueError) before
        # anything is declared, with or without all-reduced parameters.
        self.client.freq([torch.zeros(1)], [torch.zeros(1)], int(sync_every), int(warmup_steps))
        self.sync_every, self.warmup_steps = int(sync_every), int(warmup_steps)
        self.server_sync_every = (self.sync_every if server_sync_every is None
                                  else int(server_sync_every))
        if self.server_sync_every != self.sync_every:
            self.client.freq([torch.zeros(1)], None, self.server_sync_every, 0, 0, True)
        if local_optim is not None:
            if on_servers is None:
                pick = lambda n, p: default_on_servers(n, p, server_threshold)  # noqa: E731
            elif callable(on_servers):
                pick = on_servers
            else:
                chosen = set(on_servers)
                pick = lambda n, p: n in chosen  # noqa: E731
            # The model's names (without `prefix`) are what on_servers sees.
            on = {n for n, p in named if pick(n[len(prefix):], p)}
            self._local = [(n, p) for n, p in named if n not in on]
            named = [(n, p) for n, p in named if n in on]
        self._named = named
        self.local_optimizer = None
        # The gradient hooks this optimizer puts on the parameters hold it weakly, and go with
        # it (close(), or its collection): hooks of dropped optimizers over the same parameters
        # would pile up, each copying every gradient and keeping its buffers alive. The
        # buffers it lent the client (borrowed there) are withdrawn with them.
        self_ref = weakref.ref(self)
        self._hook_handles, self._lent = [], set()
        self._token = object()
        self._closer = weakref.finalize(self, _release, self.client, self._token,
                                        self._hook_handles, self._lent)
        self._closer.atexit = False
        if self._local:
            for name, p in self._local:
                _check_param(name, p)
            self.local_optimizer = local_optim([p for _, p in self._local])
            self._flatten_local()
            # A replacement of a dead worker copies the flat buffer from a live one: the
            # parameters and the optimizer's state of the live worker's last completed step.
            try:
                self._local_start = self.client.allreduce_fetch(self._flat)
            except chainps.Error as e:
                if e.code != chainps.CPS_ESHUTDOWN:
                    raise
                _replacement_too_late(self.client)
            if self._local_start is None:
                with torch.no_grad():
                    for (_, p), v in zip(self._local, self._pviews):
                        v.copy_(p.data)
            for i, ((_, p), v, g) in enumerate(zip(self._local, self._pviews, self._gviews)):
                p.data, p.grad = v, g
                self._hook_handles.append(p.register_hook(_regrad_hook(self_ref, i)))
            self._restored_step = None
            if self._local_start is None:
                self._restored_step = self._restore_local()
                if self._restored_step is None:
                    self._sync_local_from_rank0()
            elif self._slots and self._flat[-1] != 0:
                self._state_from_flat()
            self._adopt_state()
            self._listed, self._meta = False, {}
        self.optim = optim if optim is not None else chainps.SGD(0.01)
        self.overlap = overlap
        mode = self.client.mode
        self.grad_scale = 1.0 / self.client.num_workers if mode == "sync" else 1.0
        by_name = dict(named)
        if sparse is None:
            sparse = (lambda n, p: "embed" in n.lower()) if local_optim is not None else ()
        if callable(sparse):
            self._rows = {n for n, p in named if p.dim() == 2 and sparse(n[len(prefix):], p)}
        else:
            self._rows = {n for n, p in named if p.dim() == 2 and n[len(prefix):] in set(sparse)}
        self._tensors = {}
        self._send = {}
        for name, p in self._named:
            _check_param(name, p)
            if init is None:
                i = default_init(name, p, by_name, seed)
            elif callable(init):
                i = init(name, p)
            else:
                i = init
            if name in self._rows:
                t = self.client.declare_table(name, p.shape[0], p.shape[1], init=i,
                                              optim=self.optim)
            else:
                t = self.client.declare(name, tuple(p.shape), init=i, optim=self.optim)
            self._tensors[name] = t
            spec = compress(name, p) if callable(compress) else compress
            if spec is not None:
                self.client.compress(t, spec)
            if self.grad_scale != 1.0 or (self.server_sync_every > 1 and name not in self._rows):
                # (With k > 1, the buffer the server schedule sums from: it must stay put.)
                self._send[name] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        # Every worker starts from the servers' values (fresh, or those of a resumed job).
        # (With every parameter all-reduced there is nothing to pull.)
        with torch.no_grad():
            handles = [self.client.pull_async(self._tensors[n], p.data) for n, p in self._named]
            for h in handles:
                h.wait()
        # Where this worker's loop starts: the job's step for a replacement of a dead worker
        # (or a restored job), the same for every tensor (cps_start_step).
        self.start_step = self.client.start_step
        self._dense = [(n, p) for n, p in self._named if n not in self._rows]
        if self.server_sync_every > 1 and self._dense:
            # The servers' clock counts pushes, one per window of k steps: the job's step is k
            # times it (a replacement or a restored job starts at a window's boundary).
            self.start_step *= self.server_sync_every
        # Dense sync steps this replacement's loop runs without pushing to the servers.
        self._servers_ahead = 0
        if self._local and self._local_start is not None:
            if mode == "sync" and self.start_step > self._local_start:
                # The live worker pushes a step's server tensors before it all-reduces that
                # step's gradients, so the servers may have closed its sync step (without this
                # worker) while its all-reduce waits for this one. Start at the all-reduce's
                # step and skip that push: pushing the servers' next step first would wait for
                # the live worker's push of it, which waits for this worker's all-reduce.
                self._servers_ahead = self.start_step - self._local_start
            self.start_step = max(self.start_step - self._servers_ahead, self._local_start)
        if self._local and self._restored_step is not None:
            # The export's local/step: in a job whose server tensors are all row-pushed tables
            # the servers' cut is step 0 while the all-reduced half was taken later; its
            # windows and warm-up go on from there (as cps_local_fetch's step in C).
            restored = self._restored_step
            if self.server_sync_every > 1 and self._dense:
                restored *= self.server_sync_every  # committed in windows (see _share)
            self.start_step = max(self.start_step, restored)
        self.steps = 0
        if self._local:
            self._freq = self._make_freq()
        # The servers' parameters' windows (sync_every > 1): dense tensors through a cps_freq
        # over their send buffers, the tables' (rows, values) of each step of the window.
        self._sfreq = None
        self._row_win = {n: [] for n in self._rows}
        if self.server_sync_every > 1 and self._dense:
            self._sfreq = self._make_sfreq()
        self._share()
        self._handles = {}
        self._hooks = []
        if overlap:
            self._install_hooks()

    # ---- all-reduced parameters -----------------------------------------------------------
    def _flatten_local(self):
        # The all-reduced parameters and every float32 tensor of the local optimizer's state
        # live in one flat buffer (p.data and the state entries are views of it), their
        # gradients in another (p.grad): cps_freq, the share to a replacement and the
        # checkpoint listing read them in place, with no copy per step. When the optimizer has
        # state, one more value after it is 1 once that state exists (torch creates it at its
        # first step), so that a replacement knows whether to take it.
        self._slots = []  # (parameter, slot name, view of self._flat)
        layout = self._state_layout()
        npar = sum(p.numel() for _, p in self._local)
        nstate = sum(max(1, math.prod(shape)) for _, _, shape in layout)
        self._flat = torch.zeros(npar + nstate + (1 if layout else 0))
        self._grads = torch.zeros(npar)
        self._pviews, self._gviews = [], []
        off = 0
        for _, p in self._local:
            n = p.numel()
            self._pviews.append(self._flat[off:off + n].view_as(p))
            self._gviews.append(self._grads[off:off + n].view_as(p))
            off += n
        for p, key, shape in layout:
            n = max(1, math.prod(shape))
            self._slots.append((p, key, self._flat[off:off + n].view(shape)))
            off += n
        self._params_flat = self._flat[:npar]
        self._state_flat = self._flat[:npar + nstate]

    def _state_layout(self):
        # Which float32 state tensors the local optimizer will create, and their shapes, from
        # a copy of it stepped once on zero gradients (torch.optim creates its state lazily).
        # The copy keeps the groups' structure, so its i-th parameter stands for the original's.
        probe = copy.deepcopy(self.local_optimizer)
        qs = [q for g in probe.param_groups for q in g["params"]]
        ps = [p for g in self.local_optimizer.param_groups for p in g["params"]]
        with torch.no_grad():
            for q in qs:
                q.grad = torch.zeros_like(q)
        probe.step()
        layout = []
        for q, p in zip(qs, ps):
            for k, v in sorted(probe.state.get(q, {}).items()):
                if torch.is_tensor(v) and v.dtype == torch.float32:
                    layout.append((p, k, tuple(v.shape)))
        return layout

    def _adopt_state(self):
        # Move state torch created or replaced (its first step, load_state_dict) into its slot
        # of the flat buffer; in-place updates keep it there afterwards.
        st = self.local_optimizer.state
        moved = False
        for p, key, slot in self._slots:
            v = st[p].get(key) if p in st else None
            if v is None or v is slot:
                continue
            with torch.no_grad():
                slot.copy_(v)
            st[p][key] = slot
            moved = True
        if moved:
            self._flat[-1] = 1.0
        return moved

    def _state_from_flat(self):
        # A replacement: the live worker's optimizer state, as views of the fetched buffer.
        st = self.local_optimizer.state
        for p, key, slot in self._slots:
            st[p][key] = slot

    def _make_freq(self):
        # The windows and the warm-up count from the job's step (start_step may have been set
        # after the constructor). At the warm-up's end the parameters and the state are
        # averaged, in one all-reduce.
        return self.client.freq([self._grads], [self._state_flat], self.sync_every,
                                self.warmup_steps, self.start_step + self.steps)

    def _make_sfreq(self):
        # The dense server tensors' windows from the job's step, no warm-up (see sync_every).
        bufs = [self._send[n].view(-1) for n, _ in self._dense]
        return self.client.freq(bufs, None, self.server_sync_every, 0,
                                self.start_step + self.steps, True)

    def _servers_window(self):
        # The end of a step for the servers' parameters when they sync every k > 1 steps: the
        # dense tensors' sum goes into the schedule, and at the window's last step its mean is
        # push-pulled; the tables' rows of the window go as one push and one pull.
        k = self.server_sync_every
        job = self.start_step + self.steps
        if (job + 1) % k == 0:
            # The rows first: the dense push closes the servers' step (in sync mode once every
            # worker's is in), where an export cuts; rows pushed after it would miss the cut
            # (the export's table without the window's last rows, and a restored job off the
            # uninterrupted run's bits).
            for name, p in self._named:
                win = self._row_win.get(name)
                if win:
                    self._row_win[name] = []
                    self._rows_flush(name, p, win, k)
        f = self._sfreq
        if f is not None:
            if f.step != job:
                f = self._sfreq = self._make_sfreq()
            if f.grad() and not self._servers_ahead:
                hs = [self.client.push_pull_async(self._tensors[n], self._send[n], p.data)
                      for n, p in self._dense]
                for h in hs:
                    h.wait()
            f.step_end()

    def _rows_flush(self, name, p, win, k):
        # Each step's rows are unique (coalesced), so one index_add_ per step, in step order,
        # adds every row's values in the same order in every run; the rows go sorted.
        rows, inv = torch.unique(torch.cat([r for r, _ in win]), sorted=True,
                                 return_inverse=True)
        acc = torch.zeros(rows.numel(), p.shape[1])
        off = 0
        for r, v in win:
            acc.index_add_(0, inv[off:off + r.numel()], v)
            off += r.numel()
        acc.div_(float(k))  # the window's mean, as cps_freq's sum / k for dense tensors
        t = self._tensors[name]
        self.client.rows_push(t, rows, acc)
        out = torch.empty_like(acc)
        self.client.rows_pull(t, rows, out)
        p.data.index_copy_(0, rows, out)

    def _sync_local_from_rank0(self):
        # A sum in which every worker but rank 0 gives zeros is rank 0's values, bit for bit.
        with torch.no_grad():
            if self.client.rank != 0:
                self._params_flat.zero_()
            self.client.allreduce(self._params_flat, "sum")

    def _own_grads(self):
        # A parameter backward did not reach (None) contributes zeros, on every worker alike,
        # so the all-reduce's sum still matches.
        for (_, p), g in zip(self._local, self._gviews):
            _own_grad(p, g)

    def _local_step(self):
        f = self._freq
        if f.step != self.start_step + self.steps:
            f = self._freq = self._make_freq()
        self._own_grads()
        if f.grad():
            self.local_optimizer.step()
            if self._adopt_state():
                self._listed = False
        f.step_end()

    def _share(self):
        # Served to a replacement while this worker is inside a chainps call, i.e. between
        # steps: the buffer holds the last completed step's parameters and state.
        if not self._local:
            return
        step = self.start_step + self.steps
        self.client.allreduce_share(self._flat, step)
        self._lend(None)
        if self.server_sync_every > 1 and self._dense:
            # An export cuts the servers at their push clock, one push per window: the
            # all-reduced half is committed in the same unit, at the windows' boundaries only
            # (job step k * c is clock c), or no export would ever find the two halves at one
            # step (the scheduler: "the job is already past step 3").
            k = self.server_sync_every
            if step % k == 0:
                self._commit_local(step // k)
            return
        self._commit_local(step)

    # ---- the all-reduced part in checkpoints (include/chainps/localstate.h) ---------------
    def _list_local(self):
        # The parameters and the state's slots, all views of the flat buffer, so listed once
        # (again only when a slot was filled). A 0-dim slot (Adam's step) goes as one value,
        # "optim/extra" saying its shape; other state values (not float32 tensors) as JSON.
        for (n, _), v in zip(self._local, self._pviews):
            self.client.local_add(n, v, tuple(v.shape))
            self._lend(n)
        names = {id(p): n for n, p in self._local}
        shapes = {}
        st = self.local_optimizer.state
        for p, key, slot in self._slots:
            if p in st and st[p].get(key) is slot:
                n = names[id(p)]
                k = f"{_ckpt._LOCAL_OPTIM}{n}/{key}"
                self.client.local_add(k, slot, tuple(slot.shape) or (1,))
                self._lend(k)
                if not slot.dim():
                    shapes.setdefault(n, {})[key] = {"shape": []}
        self._shapes = shapes
        self._listed = True

    def _local_meta(self):
        # The param_groups (parameters by name) and the state values that are not float32
        # tensors, as JSON, rebuilt only when their plain values changed (an LR schedule).
        names = {id(p): n for n, p in self._local}
        groups = [{k: v for k, v in g.items() if k != "params"}
                  for g in self.local_optimizer.param_groups]
        slotted = {(id(p), k) for p, k, _ in self._slots}
        other = [(names[id(p)], k, v) for p, d in self.local_optimizer.state.items()
                 for k, v in d.items() if (id(p), k) not in slotted]
        sig = (_plain(groups), _plain(other), repr(self._shapes))
        if sig == self._meta.get("sig"):
            return None
        self._meta["sig"] = sig
        extra = {n: dict(d) for n, d in self._shapes.items()}
        for n, k, v in other:
            if torch.is_tensor(v):  # exact through JSON
                v = {"tensor": v.tolist(), "dtype": str(v.dtype).split(".")[-1]}
            extra.setdefault(n, {})[k] = v
        for g, og in zip(groups, self.local_optimizer.param_groups):
            g["params"] = [names[id(p)] for p in og["params"]]
        return {"optim/param_groups": json.dumps(groups, default=_jsonable),
                "optim/extra": json.dumps(extra, default=_jsonable)}

    def _lend(self, name):
        # The client's latest share (name None) or listing of `name` is this optimizer's buffer.
        key = (id(self.client), name)
        if _lender.get(key) is not self._token:
            _lender[key] = self._token
            self._lent.add(name)

    def _commit_local(self, step):
        # The step boundary: an export waiting for it copies the listed tensors now.
        if not self._listed:
            self._list_local()
        meta = self._local_meta()
        if meta is not None:
            for k, v in meta.items():
                if self._meta.get(k) != v:
                    self.client.local_meta(k, v)
                    self._meta[k] = v
        self.client.local_commit(step)

    def _restore_local(self):
        # A job restored from an export (`chainps launch --restore-from`): every worker takes
        # the all-reduced parameters and the local optimizer's state from the same file.
        # Returns the export's local/step, or None when this is not a restored job.
        path = os.environ.get("CHAINPS_RESTORE_FROM")
        if not path:
            return None
        meta = _ckpt.metadata(path)
        if not _ckpt.local_names(path, meta):
            return None
        local = _ckpt.load_local(path)
        for name, p in self._local:
            if name not in local:
                raise _ckpt.CheckpointError(f"{path}: local (all-reduced) tensor {name!r} is "
                                            f"missing")
            if tuple(local[name].shape) != tuple(p.shape):
                raise _ckpt.CheckpointError(f"{path}: local tensor {name!r}: export "
                                            f"{list(local[name].shape)}, model {list(p.shape)}")
            with torch.no_grad():
                p.data.copy_(local[name])
        state = _ckpt.local_optimizer_state(path, local)
        if state is not None:
            self.local_optimizer.load_state_dict(state)
        return int(meta.get("local/step", meta.get("step", 0)))

    def placement(self):
        """{'servers': [names], 'allreduce': [names]}: where each parameter lives."""
        return {"servers": [n for n, _ in self._named], "allreduce": [n for n, _ in self._local]}

    # ---- hooks ----------------------------------------------------------------------------
    def _install_hooks(self):
        # The hook of a parameter's AccumulateGrad node fires once its .grad holds this
        # backward's whole gradient, i.e. after every use of the parameter in backward (shared
        # weights included), so the new values may be written into it from then on.
        ref = weakref.ref(self)
        for name, p in self._named:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hook_handles.append(acc.register_hook(_push_hook(ref, name, p)))
            self._hooks.append(acc)  # the node must outlive this constructor

    def _start(self, name, p):
        if name in self._handles:
            raise RuntimeError(f"parameter {name} got a second gradient before step(): call "
                               f"step() after each backward()")
        g = p.grad
        if name in self._rows:
            self._rows_step(name, p, g)
            return
        if self._sfreq is not None:
            # Into the schedule's buffer, summed at step() (a step the servers closed before
            # this replacement joined counts as zeros, and its window pushes nothing).
            send = self._send[name]
            if g is None or self._servers_ahead:
                send.zero_()
            else:
                if g.dtype != torch.float32 or g.is_sparse:
                    g = g.to(torch.float32).to_dense()
                torch.mul(g, self.grad_scale, out=send)
            self._handles[name] = (None, send)
            return
        if self._servers_ahead:
            # A step the servers closed before this replacement joined: its parameters already
            # hold that step's result (pulled at construction), and it must push nothing.
            self._handles[name] = (None, g)
            return
        if g is None:
            g = self._zeros(name, p)
        elif g.dtype != torch.float32 or g.is_sparse or not g.is_contiguous():
            g = g.to(torch.float32).to_dense().contiguous()
        if self.grad_scale != 1.0:
            send = self._send[name]
            torch.mul(g, self.grad_scale, out=send)
            g = send
        self._handles[name] = (self.client.push_pull_async(self._tensors[name], g, p.data), g)

    def _rows_step(self, name, p, g):
        # Only the rows this step touched cross the network, both ways.
        t = self._tensors[name]
        if g is None:
            self._handles[name] = (None, None)
            return
        if g.is_sparse:
            g = g.coalesce()
            rows, vals = g.indices()[0], g.values()
        else:
            rows = torch.nonzero(g.abs().sum(1)).reshape(-1)
            vals = g.index_select(0, rows)
        if rows.numel() and self.server_sync_every > 1:
            # Kept for the window's one push (copies: the gradient's storage is reused).
            self._row_win[name].append((rows.clone(), vals.to(torch.float32) * self.grad_scale))
        elif rows.numel():
            rows = rows.contiguous()
            vals = (vals.to(torch.float32) * self.grad_scale).contiguous()
            self.client.rows_push(t, rows, vals)
            out = torch.empty_like(vals)
            self.client.rows_pull(t, rows, out)
            p.data.index_copy_(0, rows, out)
        self._handles[name] = (None, None)

    def _zeros(self, name, p):
        z = self._send.get(name)
        if z is None:
            z = self._send[name] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        else:
            z.zero_()
        return z

    # ---- the optimizer's interface --------------------------------------------------------
    def _check_open(self, call):
        # After close() the client no longer holds this optimizer's buffers; a step would lend
        # them again (allreduce_share, the checkpoint listing) and a zero_grad would hand the
        # parameters its gradient views back, behind the next optimizer's back.
        if not self._closer.alive:
            raise RuntimeError(f"DistributedOptimizer.{call}() after close(): its hooks and "
                               f"buffers were withdrawn; create a new DistributedOptimizer")

    def zero_grad(self, set_to_none=True):
        """Clear the gradients (as torch.optim's zero_grad). RuntimeError after close()."""
        self._check_open("zero_grad")
        if self._local:
            # The all-reduced parameters keep their gradient views (cps_freq reads them).
            self._grads.zero_()
            for (_, p), g in zip(self._local, self._gviews):
                p.grad = g
        for _, p in self._named:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    def step(self, closure=None):
        """Finish this step: push what the hooks did not (a parameter with no gradient pushes
        zeros, so a sync step still completes), wait for every push-pull, and leave the new
        parameters in the model. Returns the closure's loss when one is given. RuntimeError
        after close()."""
        self._check_open("step")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for name, p in self._named:
                if name not in self._handles:
                    self._start(name, p)
            try:
                for name, _ in self._named:
                    if self._handles[name][0] is not None:
                        self._handles[name][0].wait()
            finally:
                self._handles.clear()
            if self.server_sync_every > 1:
                self._servers_window()
        if self._servers_ahead:
            self._servers_ahead -= 1
        if self._local:
            self._local_step()
        self.steps += 1
        self._share()
        return loss

    @property
    def step_count(self):
        """The job's step: the step this run started at plus the steps taken since."""
        return self.start_step + self.steps

    def pull(self):
        """Bring the servers' current parameters into the model (after an async job, say)."""
        with torch.no_grad():
            handles = [self.client.pull_async(self._tensors[n], p.data) for n, p in self._named]
            for h in handles:
                h.wait()

    def tensors(self):
        """The declared chainps tensors by name."""
        return dict(self._tensors)

    def close(self):
        """Take this optimizer's gradient hooks off the parameters, so that another
        DistributedOptimizer may train them (done as well when it is garbage-collected). The
        parameters keep their values (the all-reduced ones as views of this optimizer's
        buffer); step() and zero_grad() raise RuntimeError afterwards. Calling it again does
        nothing."""
        self._closer()


def _own_grad(p, g):
    # p's gradient into g, its view of the flat gradient buffer, and g as p.grad again: a
    # gradient the program assigned is copied (kept, not lost), None (zero_grad(set_to_none=True)
    # outside this class, or backward did not reach p) becomes zeros.
    if p.grad is not g:
        with torch.no_grad():
            if p.grad is None:
                g.zero_()
            else:
                g.copy_(p.grad)
        p.grad = g


def _regrad_hook(ref, i):
    # Runs before backward accumulates into p.grad: p gets its view back, so autograd adds into
    # the flat buffer in place and a step allocates and copies nothing (after a zero_grad that
    # set p.grad to None, say). `ref` is weak: a dropped optimizer's hook does nothing.
    def hook(_):
        o = ref()
        if o is not None:
            _own_grad(o._local[i][1], o._gviews[i])

    return hook


def _push_hook(ref, name, p):
    def hook(*_):
        o = ref()
        if o is not None:
            o._start(name, p)

    return hook


# (id(client), name or None) -> the token of the optimizer whose buffer the client holds there
# (None: its allreduce_share), so that a dropped optimizer withdraws only what is still its own.
_lender = {}


def _release(client, token, handles, lent):
    for h in handles:
        h.remove()
    handles.clear()
    for name in lent:
        key = (id(client), name)
        if _lender.get(key) is not token:
            continue  # another optimizer lent its own buffer there since
        del _lender[key]
        try:
            if name is None:
                client.allreduce_share(None)
            else:
                client.local_add(name, None)
        except ValueError:  # the client is closed: it holds nothing any more
            pass
    lent.clear()


def _plain(o):
    # A value comparable with ==: tensors as their lists (a hyper-parameter given as a tensor).
    if torch.is_tensor(o):
        return ("tensor", str(o.dtype), o.tolist())
    if isinstance(o, dict):
        return tuple((k, _plain(v)) for k, v in o.items())
    if isinstance(o, (list, tuple)):
        return tuple(_plain(v) for v in o)
    return o


def _jsonable(o):
    # A hyper-parameter given as a tensor (a learning rate, say): its values.
    return o.tolist() if torch.is_tensor(o) else str(o)


def default_on_servers(name, param, threshold=1 << 16):
    """The default hybrid placement: embeddings (a name containing "embed") and tensors of
    ``threshold`` values or more live on the servers; the rest are all-reduced."""
    return "embed" in name.lower() or param.numel() >= threshold


def load_state_dict(model, path, strict=True):
    """Load a chainps checkpoint into a model: shapes are checked first and every mismatch is
    named (CheckpointError), then ``model.load_state_dict`` runs. Buffers a model has and a
    checkpoint lacks (BatchNorm's running statistics) are left as they are when ``strict`` is
    false. Returns the checkpoint's step."""
    state = _ckpt.load(path)
    model_params = dict(model.named_parameters())
    _ckpt.check_shapes(state, model_params if not strict else
                       {k: v for k, v in model.state_dict().items()})
    model.load_state_dict(state, strict=strict)
    return _ckpt.step(path)
