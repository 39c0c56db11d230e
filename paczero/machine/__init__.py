"""The machine a run uses: dtype, threads and core counts (:mod:`.hardware`), the cores shared between
processes of one user (:mod:`.thread_share`).

Imports: the top's config and checkpoint only.
"""
