"""How often a gloo rank aborts at exit: two processes meet in all_gather_object, then exit with code 2,
having destroyed the process group (``destroy``) or not (``none``). Prints the exit codes counted.

    python gloo_exit.py destroy 60; python gloo_exit.py none 60

2026-11-23, the project's 2-core CPU machine with two `yes` processes loading both cores: destroy {2: 120};
none {2: 111, -6: 9} ("terminate called without an active exception"). Hence DataParallel.close.
"""
import os, sys, subprocess
from paczero.distributed import free_port
# plain subprocesses (no mp error handling): count exit codes
mode, n = sys.argv[1], int(sys.argv[2])
code = r'''
import os, sys, torch.distributed as tdist
r = int(sys.argv[1]); os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
tdist.init_process_group("gloo", rank=r, world_size=2)
out = [None, None]
tdist.all_gather_object(out, ("x" if r == 0 else "y", None))
if sys.argv[3] == "barrier": tdist.barrier()
if sys.argv[3] != "none": tdist.destroy_process_group()
sys.exit(2)
'''
from collections import Counter
c = Counter()
for i in range(n):
    port = str(free_port())
    ps = [subprocess.Popen([sys.executable, "-c", code, str(r), port, mode], stderr=subprocess.PIPE) for r in (0, 1)]
    for p in ps:
        _, err = p.communicate()
        c[p.returncode] += 1
        if p.returncode != 2: print(err.decode()[-500:])
print(mode, dict(c))
