"""The machine a run uses: dtype, threads and core counts (:mod:`.hardware`), the cores shared between
processes of one user (:mod:`.thread_share`), and one line when other work makes the machine busier than its
cores (:mod:`.busy`).

Imports: the top's config and checkpoint only.
"""
