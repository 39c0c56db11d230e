"""Kill points for the crash tests: patches that SIGKILL the training process at a chosen moment.

Imported by the test wrappers (a training subprocess, a spawned data-parallel rank); the library has no
test hook of its own."""
import os
import signal


def kill_after_logged_step(at: int) -> None:
    """SIGKILL this process once step ``at``'s record is in log.jsonl (and its checkpoint written, if due):
    the progress bar's update follows both."""
    signal_after_steps(at + 1, signal.SIGKILL)


def signal_after_steps(done: int, sig: int, patch=setattr) -> None:
    """Send this process ``sig`` as the progress bar counts its ``done``-th step (its record logged and its
    checkpoint written, if due): SIGKILL a crash, SIGTERM a stop the loop answers with a checkpoint. ``patch``:
    how the loop's progress bar is replaced (``monkeypatch.setattr`` in a test's own process)."""
    import paczero.train as tr

    progress = tr._progress

    def signalling_progress(cfg, start):
        bar, counted_so_far = progress(cfg, start), [start]
        update = bar.update

        def counted(n=1):
            update(n)
            counted_so_far[0] += n
            if counted_so_far[0] == done:
                os.kill(os.getpid(), sig)
        bar.update = counted
        return bar
    patch(tr, "_progress", signalling_progress)


def trace_draws(path, patch=setattr) -> None:
    """Append to ``path`` one line for each private or batch draw of a first-order run, ``sample N`` (the batch of
    step N: DP-SGD's Poisson sample from the private stream, adamw's seeded mini-batch) and ``noise N`` (DP-SGD's
    Gaussian noise of step N), flushed at once (a SIGKILL loses none). ``patch``: ``setattr``, or a pytest
    monkeypatch's ``setattr`` in process."""
    from paczero.mechanisms import DPSGD, NonPrivateAdamW

    def traced(cls, name):
        original = getattr(cls, name)

        def draw(self, *args, **kwargs):
            with open(path, "a") as f:
                f.write(f"{'noise' if name == 'noise' else 'sample'} {self.steps}\n")
            return original(self, *args, **kwargs)
        patch(cls, name, draw)

    traced(DPSGD, "batch_indices")
    traced(DPSGD, "noise")
    traced(NonPrivateAdamW, "batch_indices")
