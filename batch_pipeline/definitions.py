"""Dagster entry point (``workspace.yaml``, ``batch-pipeline dev``, and the dg project's code location): one set of
assets, checks, jobs and sensors per job of the project.

The project's jobs are the Components of the defs folder (``batch_pipeline/jobs/<job>/defs.yaml``, each a
``BatchInferenceJob``) and the specs of the jobs folder (``data/jobs/*.yaml``). With ``$BATCH_PIPELINE_JOBS``
naming another folder, that folder's specs are the code location's jobs, as before the defs folder.
"""

from batch_pipeline.defs.project import project_definitions
from batch_pipeline.process_exit import no_collection_at_exit

no_collection_at_exit()  # Dagster's code servers and run workers load this module: their exits skip the last GC
defs = project_definitions()
