"""Data parallelism: 2 gloo processes give the single-process transcript and weights, bit for bit."""
import json
import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from paczero.config import DP_MECHANISMS, TrainConfig
from paczero.run.distributed import free_port, shard_batches, shard_plan


class _B:
    def __init__(self, tokens, index):
        self.num_tokens, self.index = tokens, np.asarray(index)


def test_shard_plan_balances_tokens_and_covers_every_batch():
    batches = [_B(t, [i]) for i, t in enumerate([100, 90, 50, 40, 30, 10])]
    plan = shard_plan(batches, 2)
    assert sorted(b for p in plan for b in p) == list(range(6))
    loads = [sum(batches[b].num_tokens for b in p) for p in plan]
    assert abs(loads[0] - loads[1]) <= 20  # LPT: within the last batches placed
    assert all(p == sorted(p) for p in plan)
    assert shard_batches(batches, 0, 1) == batches
    assert shard_plan(batches[:1], 3)[1:] == [[], []]  # more ranks than batches: idle ranks


#: the tiny run of these tests (as TrainConfig keys; `_CLI` is the same as `paczero train` flags)
_SETTINGS = dict(model="tiny-llama", track="ft", task="demo", n_train=16, n_dev=8, n_test=8, steps=4,
                 mechanism="pac-mi", mi_budget=0.5, num_subsets=8, lr=1e-2, mu=1e-2, token_budget=64,
                 eval_every=2, checkpoint_every=2, eval_zero_shot=False, progress=False, seed=3,
                 private_seed=1234, device="cpu", threads=1)  # one thread in every process, whatever else runs
_CLI = [arg for k, v in _SETTINGS.items() for arg in
        ([f"--{'' if v else 'no-'}{k.replace('_', '-')}"] if isinstance(v, bool) else [f"--{k.replace('_', '-')}", str(v)])]


def _config(out_dir: str) -> TrainConfig:
    return TrainConfig(**_SETTINGS, out_dir=out_dir)


def _rank(rank: int, world: int, port: int, out_dir: str, other_directions_rank: int = -1) -> None:
    import torch.distributed as tdist

    import paczero.privacy.subsets
    import paczero.train

    torch.set_num_threads(1)
    if rank == other_directions_rank:  # this rank's z from another generator (on CUDA: torch's instead of Triton's)
        import paczero.zo.perturb

        paczero.zo.perturb.source_name = lambda device, fused: "another generator (cpu)"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    if rank:  # the other ranks must never build a mechanism nor draw a secret
        def forbidden(*a, **k):
            raise AssertionError("a rank other than 0 touched private state")
        paczero.train.make_mechanism = forbidden
        paczero.privacy.subsets.private_generator = forbidden
    try:
        out = paczero.train.train(_config(out_dir), log=lambda *a: None)
        assert ("privacy" in out) == (rank == 0)
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()
    _leave()


def _leave() -> None:
    """End a rank that returned cleanly without the interpreter's teardown, where gloo's threads abort a process
    now and then ("terminate called without an active exception", docs/distributed.md), once seen even after
    ``destroy_process_group``; the test reads what each rank did from files it has closed. A rank that raised
    never gets here and exits with its error."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _transcript(run_dir):
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "log.jsonl"))]
    for r in rows:
        r.pop("seconds")
    return rows


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The run of :func:`_config` in one process, with one thread (the same kernels as each rank)."""
    from paczero.train import train

    out = tmp_path_factory.mktemp("dp") / "single"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(_config(str(out)), log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.slow
def test_two_processes_match_one(single, tmp_path):
    multi = str(tmp_path / "multi")
    mp.start_processes(_rank, args=(2, free_port(), multi), nprocs=2, start_method="spawn", join=True)

    a, b = _transcript(single), _transcript(multi)
    assert len(a) == 4 and a == b
    assert any(r["branch"] == "noised" for r in a) or any(r["branch"] == "unanimous" for r in a)
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{multi}/selected.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [json.loads(x) for x in open(f"{single}/evals.jsonl")] == [json.loads(x) for x in open(f"{multi}/evals.jsonl")]
    assert not os.path.exists(os.path.join(multi, "rank1"))  # nothing but rank 0's files
    assert json.load(open(f"{multi}/run.json"))["directions"] == "torch generator per chunk (cpu)"


@pytest.mark.slow
def test_ranks_that_would_draw_other_directions_refuse_to_start(tmp_path):
    """A rank whose z comes from another generator (on CUDA, say Triton is missing there) stops every rank
    before the first step, naming the difference; negative control: the same launch with agreeing ranks
    trains."""

    with pytest.raises(Exception, match="disagree on directions"):
        mp.start_processes(_rank, args=(2, free_port(), str(tmp_path / "a"), 1), nprocs=2, start_method="spawn",
                           join=True)
    assert not os.path.exists(tmp_path / "a" / "log.jsonl") or not open(tmp_path / "a" / "log.jsonl").read()
    mp.start_processes(_rank, args=(2, free_port(), str(tmp_path / "b"), -1), nprocs=2, start_method="spawn",
                       join=True)
    assert len(_transcript(tmp_path / "b")) == 4


def _rank_with(rank: int, world: int, port: int, configs: list, retokenize_rank: int = -1,
               sigterm_at: tuple[int, int] = (-1, -1), kill_after: int = -1) -> None:
    """A rank that trains ``configs[rank]`` through the CLI's error handling; ``retokenize_rank``
    appends a token to every prompt there (a rank whose tokenizer differs); rank ``sigterm_at[0]``
    sends itself SIGTERM while it scores step ``sigterm_at[1]``; rank 0 SIGKILLs itself once step
    ``kill_after`` is in log.jsonl."""
    import contextlib
    import io

    import torch.distributed as tdist

    import paczero.tasks.classification as classification
    from paczero.cli import bad_input
    from paczero.train import train

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    if rank == retokenize_rank:
        tokenize = classification.tokenize
        classification.tokenize = lambda tok, texts: [ids + [ids[-1]] for ids in tokenize(tok, texts)]
    if rank == sigterm_at[0]:
        import signal

        import paczero.zo as zo
        scalars = zo.two_point_scalars

        def signalled(perturber, step, *args, **kwargs):
            if step == sigterm_at[1]:
                os.kill(os.getpid(), signal.SIGTERM)
            return scalars(perturber, step, *args, **kwargs)
        zo.two_point_scalars = signalled
    if rank == 0 and kill_after >= 0:
        from killpoints import kill_after_logged_step

        kill_after_logged_step(kill_after)
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            try:
                train(TrainConfig(**configs[rank]), log=lambda *a: None)
                code = 0
            except ValueError as e:  # what `paczero train` prints for it, and its exit code
                code = bad_input(e)
        with open(f"{configs[rank]['out_dir']}.rank{rank}.txt", "w") as f:
            f.write(f"{code}\n{err.getvalue()}")
    finally:
        if tdist.is_initialized():
            tdist.destroy_process_group()
    _leave()


def _stopped(out_dir: str, rank: int) -> tuple[int, str]:
    code, _, err = open(f"{out_dir}.rank{rank}.txt").read().partition("\n")
    return int(code), err


@pytest.mark.slow
def test_ranks_stop_together_when_their_data_or_tokens_differ(tmp_path):
    """Ranks must score the same sequences: other examples (a node's copy of the data file differs)
    or other tokens (a node's tokenizer differs) stop every rank before the first step, with one
    line (rank 0's; rank 1, not its node's first process, is silent) and exit code 2. Control: two
    paths to identical files train (the path is not compared, the content is)."""
    from paczero.tasks.data import DEMO_PATH

    lines = open(DEMO_PATH).read().splitlines()
    same, copy, other = tmp_path / "same.jsonl", tmp_path / "copy.jsonl", tmp_path / "other.jsonl"
    same.write_text("\n".join(lines) + "\n")
    copy.write_text("\n".join(lines) + "\n")
    edited = [json.loads(x) for x in lines]
    for ex in edited:
        ex["text"] += " Really."
    other.write_text("".join(json.dumps(ex) + "\n" for ex in edited))

    def launch(name: str, data_1, retokenize_rank: int = -1) -> str:
        out = str(tmp_path / name)
        base = {**_config(out).to_dict(), "data": str(same), "columns": {"sentence": "text"}}
        configs = [base, {**base, "data": str(data_1)}]
        mp.start_processes(_rank_with, args=(2, free_port(), configs, retokenize_rank), nprocs=2,
                           start_method="spawn", join=True)
        return out

    for out, what in ((launch("examples", other), "disagree on data: examples"),
                      (launch("tokens", same, retokenize_rank=1), "disagree on data: tokens")):
        (code0, err0), (code1, err1) = _stopped(out, 0), _stopped(out, 1)
        assert (code0, code1) == (2, 2) and err1 == ""
        assert err0.count("paczero: error:") == 1 and what in err0, err0
        assert not os.path.exists(os.path.join(out, "run.json"))
    out = launch("control", copy)
    assert [_stopped(out, r)[0] for r in (0, 1)] == [0, 0] and len(_transcript(out)) == 4
    with pytest.raises(AssertionError):  # the check above sees a stop where there is none
        assert _stopped(out, 0)[0] == 2


def _torchrun_nodes(tmp_path, args_per_node: list[list[str]], timeout: float = 240) -> list[tuple[int, str]]:
    """``torchrun`` as on two nodes (one process each, node 0 at 127.0.0.1): each node's exit code and log."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    port = free_port()
    procs = []
    for node, args in enumerate(args_per_node):
        log = open(tmp_path / f"node{node}.log", "w")
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(args_per_node)), "--node-rank",
             str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
             "-m", "paczero.cli", "train", *args], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path), log))
    results = []
    for node, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                for p, _ in procs:
                    p.kill()
            log.close()
        results.append((proc.returncode, (tmp_path / f"node{node}.log").read_text()))
    return results




@pytest.mark.slow
def test_torchrun_across_two_nodes_matches_one_process(tmp_path):
    """The real launcher, as on two nodes (two torchrun agents, one rank each, a static rendezvous at
    node 0): the same transcript and weights as `paczero train` in one process, bit for bit."""
    from paczero.cli import main

    single, multi = str(tmp_path / "single"), str(tmp_path / "multi")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1 in each rank
    try:
        assert main(["train", *_CLI, "--out-dir", single]) == 0
    finally:
        torch.set_num_threads(threads)
    results = _torchrun_nodes(tmp_path, [[*_CLI, "--out-dir", multi], [*_CLI, "--out-dir", str(tmp_path / "unused")]])
    assert [code for code, _ in results] == [0, 0], results[1][1][-3000:]
    assert _transcript(single) == _transcript(multi) and len(_transcript(multi)) == 4
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{multi}/selected.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not os.path.exists(tmp_path / "unused")  # node 1 writes nothing


@pytest.mark.slow
def test_bad_input_on_one_node_stops_every_node(tmp_path):
    """Bad input on node 1's command line stops node 0 too, within seconds (node 0 does not wait for
    the missing rank in init_process_group until its two-hour timeout): one `paczero: error:` line per node and
    exit code 2 in every rank. So do command lines that differ in a setting of the computation."""
    out = str(tmp_path / "run")
    missing = [*_CLI, "--out-dir", out, "--data", str(tmp_path / "missing.jsonl")]
    for node1, line0, line1 in (
            (missing, "paczero: error: rank 1 stopped: data file", "paczero: error: data file"),
            ([*_CLI, "--out-dir", out, "--mu", "2e-2"], "disagree on settings: mu (rank 0: 0.01; rank 1: 0.02)",
             "disagree on settings: mu (rank 0: 0.01; rank 1: 0.02)")):
        (rc0, log0), (rc1, log1) = _torchrun_nodes(tmp_path, [[*_CLI, "--out-dir", out], node1], timeout=120)
        assert rc0 != 0 and rc1 != 0
        for log, line in ((log0, line0), (log1, line1)):
            assert log.count("paczero: error:") == 1 and line in log, log[-3000:]
            assert "exitcode  : 2" in log and "[rank" not in log  # the ranks exited 2, with no traceback
        assert not os.path.exists(os.path.join(out, "log.jsonl"))


def test_the_compared_settings_never_carry_the_private_seed():
    """What rank 0 sends the others before the first step holds the settings of the computation and the
    libraries' versions, and not the private seed (nor the run folder or the data's path)."""
    from paczero.run.distributed import UNCOMPARED_KEYS, shared_settings

    cfg = _config("/runs/x").replace(private_seed=987654321, data="/data/a.jsonl")
    sent = json.dumps(shared_settings(cfg))
    assert "987654321" in json.dumps(cfg.to_dict())  # control: the config holds it
    assert "987654321" not in sent and "/runs/x" not in sent and "/data/a.jsonl" not in sent
    settings = shared_settings(cfg)
    assert settings["mu"] == cfg.mu and settings["seed"] == cfg.seed and settings["torch version"] == torch.__version__
    assert set(cfg.to_dict()) - set(settings) == set(UNCOMPARED_KEYS)


@pytest.mark.slow
def test_two_processes_resume_a_run_as_one_would(single, tmp_path):
    """A run resumed under data parallelism (rank 0 reads the checkpoint and the journal, restores the
    mechanism's state, replays the logged steps after the checkpoint and sends the weights to the other
    rank) ends as the uninterrupted single process: the same transcript, evaluations and selected
    weights, bit for bit. Its first steps were one process's."""
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(single, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-000004")  # killed before its last checkpoint: resume at 2
    config = {**_config(str(resumed)).to_dict(), "resume": True}
    mp.start_processes(_rank_with, args=(2, free_port(), [config, config]), nprocs=2, start_method="spawn",
                       join=True)
    assert [_stopped(str(resumed), r)[0] for r in (0, 1)] == [0, 0]
    assert (resumed / "checkpoints" / "step-000004").is_dir()  # steps 3 and 4 replayed, then checkpointed
    assert _transcript(single) == _transcript(resumed)
    assert (single / "evals.jsonl").read_text() == (resumed / "evals.jsonl").read_text()
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{resumed}/selected.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


#: every mechanism with a private state, as config keys over _SETTINGS
MECHANISMS = {
    "pac-mi": {},
    "pac-zpl": {"mechanism": "pac-zpl", "mi_budget": None},
    "hybrid": {"mechanism": "hybrid", "switch_step": 2},
    "dpzero": {"mechanism": "dpzero", "mi_budget": None, "epsilon": 2.0, "sample_rate": 0.5},
    "dp-aggzo": {"mechanism": "dp-aggzo", "mi_budget": None, "epsilon": 2.0, "sample_rate": 0.5, "num_directions": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_two_processes_killed_after_a_logged_step_resume_without_executing_it_again(mechanism, tmp_path):
    """Both ranks SIGKILLed once step 3 is logged (rank 0 is killed; rank 1 loses it): the log holds 3
    steps, the newest checkpoint is step 2. The resume under two ranks replays step 3's published update
    on rank 0 and sends the weights to rank 1; every record logged before the kill is unchanged and the
    finished run is the uninterrupted single process's, bit for bit. Red if a resume executes logged
    steps again from the checkpoint's private state (the private draws of step 3 would be used twice)."""
    from paczero.train import train

    settings = {**_SETTINGS, **MECHANISMS[mechanism]}
    single = tmp_path / "single"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(TrainConfig(**settings, out_dir=str(single)), log=lambda *a: None)
    finally:
        torch.set_num_threads(threads)
    run = tmp_path / "run"
    config = TrainConfig(**settings, out_dir=str(run)).to_dict()
    with pytest.raises(Exception):
        mp.start_processes(_rank_with, args=(2, free_port(), [config, config], -1, (-1, -1), 2), nprocs=2,
                           start_method="spawn", join=True)
    work = run / "private" / "stage" if settings["mechanism"] in DP_MECHANISMS else run  # a DP run publishes at its end
    published = (work / "log.jsonl").read_text().splitlines()
    assert len(published) == 3 and sorted(p.name for p in (work / "checkpoints").iterdir()) == ["step-000002"]
    resumed = {**config, "resume": True}
    mp.start_processes(_rank_with, args=(2, free_port(), [resumed, resumed]), nprocs=2, start_method="spawn",
                       join=True)
    assert [_stopped(str(run), r)[0] for r in (0, 1)] == [0, 0]
    assert (run / "log.jsonl").read_text().splitlines()[:3] == published
    assert _transcript(single) == _transcript(run)
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{run}/selected.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_sigterm_on_another_rank_ends_the_run_with_a_checkpoint(single, tmp_path):
    """torchrun passes a SIGTERM (a preempted job) to every rank of a node, which may not be rank 0's:
    a rank other than 0 that gets it keeps going and sends the request with its next scalars; rank 0
    ends the run after that step with a checkpoint, as on its own SIGTERM. Resumed, the run is the
    uninterrupted one. Negative control: the same launch without the signal runs to the end."""
    run = tmp_path / "run"
    config = _config(str(run)).to_dict()
    mp.start_processes(_rank_with, args=(2, free_port(), [config, config], -1, (1, 1)), nprocs=2,
                       start_method="spawn", join=True)
    assert [_stopped(str(run), r)[0] for r in (0, 1)] == [0, 0]
    # signalled while scoring step 1; the request went with step 2's scalars: three steps, checkpointed
    assert len(_transcript(run)) == 3 and (run / "checkpoints" / "step-000003").is_dir()
    assert not (run / "summary.json").exists()
    resumed = {**config, "resume": True}
    mp.start_processes(_rank_with, args=(2, free_port(), [resumed, resumed]), nprocs=2, start_method="spawn",
                       join=True)
    assert _transcript(single) == _transcript(run)
    wa, wb = load_file(f"{single}/selected.safetensors"), load_file(f"{run}/selected.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    control = tmp_path / "control"
    config = _config(str(control)).to_dict()
    mp.start_processes(_rank_with, args=(2, free_port(), [config, config]), nprocs=2, start_method="spawn",
                       join=True)
    assert len(_transcript(control)) == 4 and (control / "summary.json").exists()


@pytest.mark.slow
def test_an_invalid_config_on_one_rank_stops_the_others(tmp_path):
    """`train()` called by each rank (the Python API) with a config that fails validation on rank 1
    only: rank 1 hands its error over, and both ranks stop with code 2, rank 0 naming rank 1's error,
    instead of rank 0 waiting for rank 1 in the first collective."""
    out = str(tmp_path / "run")
    good = _config(out).to_dict()
    mp.start_processes(_rank_with, args=(2, free_port(), [good, {**good, "num_subsets": 7}]), nprocs=2,
                       start_method="spawn", join=True)
    (code0, err0), (code1, err1) = _stopped(out, 0), _stopped(out, 1)
    assert (code0, code1) == (2, 2) and err1 == ""
    assert err0.strip() == "paczero: error: rank 1 stopped: num_subsets (M) must be even, got 7"
