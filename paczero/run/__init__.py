"""One training run's life around the loop (:mod:`paczero.train`): what a run is built from (:mod:`.build`),
the data-parallel ranks (:mod:`.distributed`), a stop on request (:mod:`.stop`), the private journal and
resume (:mod:`.journal`, :mod:`.resume`), the public step record (:mod:`.step_record`), a DP run's one-time
publication (:mod:`.publish`), T-ladder rungs (:mod:`.rungs`), the released model (:mod:`.release`), curves
and live trackers (:mod:`.curves`, :mod:`.trackers`), the learning rate chosen on dev among candidate runs
(:mod:`.lr_choice`, the loop handed in).

Imports: the top's config, checkpoint and models; machine, privacy, tasks, zo. Never audit, experiments or the loop.
"""
