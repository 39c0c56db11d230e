"""Audits of finished runs: the membership-inference audit of S* (:mod:`.membership`), the loss attack of U
against held-out records (:mod:`.heldout`), the last-bits attack on published values (:mod:`.lsb_attack`).

Imports: run (build, distributed), privacy, tasks, zo and the top's config, checkpoint and models; never the loop.
"""
