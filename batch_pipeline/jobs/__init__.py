"""The dg project's defs folder: one ``<job>/defs.yaml`` per job, each a ``batch_pipeline.BatchInferenceJob`` whose
attributes are the job spec. ``dg scaffold defs batch_pipeline.BatchInferenceJob NAME`` adds one; ``dg list defs``
and ``dg check defs`` load them. Specs in ``data/jobs/*.yaml`` are loaded beside them (definitions.py)."""
