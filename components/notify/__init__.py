"""The exit-handler component: reports how the run ended, whatever happened to the other steps."""

from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def notify(status: dsl.PipelineTaskFinalStatus, pipeline_name: str = "gpupipe-training"):
    """Print one JSON line with the run's final state and, on failure, the failed tasks' errors."""
    import json

    print(
        json.dumps(
            {
                "event": "pipeline_finished",
                "pipeline": pipeline_name,
                "state": status.state,
                "run_id": status.pipeline_job_resource_name,
                "error_code": status.error_code,
                "error": status.error_message,
            }
        ),
        flush=True,
    )
