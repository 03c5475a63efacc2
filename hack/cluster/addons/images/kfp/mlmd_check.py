"""Checks an ML Metadata gRPC service the way KFP's driver and launcher use it.

Through ml-metadata's own gRPC client: a put and a get of each kind of call the driver and launcher
make (types, contexts and parent contexts, executions with their events, artifacts, look-ups by
id, name, URI, context and event), each read back and compared. Prints one line per check and
`mlmd-check: all N checks passed` last; exits 1 at the first mismatch, naming it.
Usage: python mlmd_check.py HOST PORT
"""

from __future__ import annotations

import socket
import sys
import time
import uuid

from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2 as pb

passed = 0


def check(what: str, ok: bool, got: object = "") -> None:
    global passed
    if not ok:
        print(f"mlmd-check: FAILED {what} (got {got!r})", flush=True)
        sys.exit(1)
    passed += 1
    print(f"mlmd-check: ok {what}", flush=True)


def wait_for(host: str, port: int, seconds: float = 30) -> None:
    """Until a connection opens: ML Metadata's NetworkPolicy admits this pod once kube-router has
    synced its address, a moment after it starts (a check at once was refused two runs in three)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=5).close()
            return
        except OSError as e:
            if time.monotonic() > deadline:
                print(f"mlmd-check: FAILED no connection to {host}:{port} in {seconds:g} s: {e}")
                sys.exit(1)
            time.sleep(0.5)


def main(host: str, port: int) -> None:
    wait_for(host, port)
    cfg = pb.MetadataStoreClientConfig(host=host, port=port)
    store = metadata_store.MetadataStore(cfg)
    tag = uuid.uuid4().hex[:8]

    # Types, as the driver registers them (system.ContainerExecution, system.Artifact, ...).
    art_type = pb.ArtifactType(name=f"system.Model.{tag}")
    art_type.properties["version"] = pb.STRING
    art_type_id = store.put_artifact_type(art_type)
    check(
        "PutArtifactType / GetArtifactType",
        store.get_artifact_type(art_type.name).id == art_type_id,
    )
    exec_type_id = store.put_execution_type(
        pb.ExecutionType(name=f"system.ContainerExecution.{tag}")
    )
    check(
        "PutExecutionType / GetExecutionType",
        store.get_execution_type(f"system.ContainerExecution.{tag}").id == exec_type_id,
    )
    run_type_id = store.put_context_type(pb.ContextType(name=f"system.PipelineRun.{tag}"))
    pipe_type_id = store.put_context_type(pb.ContextType(name=f"system.Pipeline.{tag}"))
    check(
        "PutContextType / GetContextType",
        store.get_context_type(f"system.PipelineRun.{tag}").id == run_type_id,
    )

    # The pipeline and run contexts, the run a child of the pipeline.
    pipe = pb.Context(type_id=pipe_type_id, name=f"gpupipe-{tag}")
    run = pb.Context(type_id=run_type_id, name=f"run-{tag}")
    run.custom_properties["namespace"].string_value = "kubeflow"
    pipe_id, run_id = store.put_contexts([pipe, run])
    got = store.get_context_by_type_and_name(f"system.PipelineRun.{tag}", f"run-{tag}")
    check(
        "PutContexts / GetContextByTypeAndName",
        got.id == run_id and got.custom_properties["namespace"].string_value == "kubeflow",
        got,
    )
    check("GetContextsByID", [c.name for c in store.get_contexts_by_id([pipe_id])] == [pipe.name])
    store.put_parent_contexts([pb.ParentContext(child_id=run_id, parent_id=pipe_id)])
    check(
        "PutParentContexts / GetParentContextsByContext",
        [c.id for c in store.get_parent_contexts_by_context(run_id)] == [pipe_id],
    )

    # An execution with an output artifact and its event, attributed to the run (PutExecution).
    execution = pb.Execution(
        type_id=exec_type_id, name=f"train-{tag}", last_known_state=pb.Execution.RUNNING
    )
    execution.custom_properties["task_name"].string_value = "train"
    artifact = pb.Artifact(
        type_id=art_type_id,
        uri=f"minio://mlpipeline/v2/artifacts/{tag}/model",
        state=pb.Artifact.LIVE,
    )
    artifact.properties["version"].string_value = "1"
    event = pb.Event(type=pb.Event.OUTPUT)
    event.path.steps.add().key = "model"
    exec_id, (art_id,), _ = store.put_execution(
        execution, [(artifact, event)], [pb.Context(id=run_id, type_id=run_type_id, name=run.name)]
    )
    (got_exec,) = store.get_executions_by_id([exec_id])
    check(
        "PutExecution / GetExecutionsByID",
        got_exec.name == execution.name
        and got_exec.custom_properties["task_name"].string_value == "train",
        got_exec,
    )
    check(
        "GetExecutionByTypeAndName",
        store.get_execution_by_type_and_name(f"system.ContainerExecution.{tag}", execution.name).id
        == exec_id,
    )
    check(
        "GetExecutionsByContext",
        [e.id for e in store.get_executions_by_context(run_id)] == [exec_id],
    )
    check(
        "GetContextsByExecution",
        [c.id for c in store.get_contexts_by_execution(exec_id)] == [run_id],
    )
    (got_art,) = store.get_artifacts_by_id([art_id])
    check(
        "PutExecution's artifact / GetArtifactsByID",
        got_art.uri == artifact.uri and got_art.properties["version"].string_value == "1",
        got_art,
    )
    check("GetArtifactsByURI", [a.id for a in store.get_artifacts_by_uri(artifact.uri)] == [art_id])
    check(
        "GetContextsByArtifact", [c.id for c in store.get_contexts_by_artifact(art_id)] == [run_id]
    )
    events = store.get_events_by_execution_ids([exec_id])
    check(
        "GetEventsByExecutionIDs",
        [(e.artifact_id, e.type, e.path.steps[0].key) for e in events]
        == [(art_id, pb.Event.OUTPUT, "model")],
        events,
    )
    check(
        "GetEventsByArtifactIDs",
        [e.execution_id for e in store.get_events_by_artifact_ids([art_id])] == [exec_id],
    )

    # The launcher's update: the execution completes (PutExecution on an existing id), and a
    # metrics artifact is added with PutArtifacts.
    got_exec.last_known_state = pb.Execution.COMPLETE
    store.put_execution(got_exec, [], [])
    check(
        "PutExecution (update)",
        store.get_executions_by_id([exec_id])[0].last_known_state == pb.Execution.COMPLETE,
    )
    (metrics_id,) = store.put_artifacts(
        [pb.Artifact(type_id=art_type_id, uri=f"{artifact.uri}-metrics")]
    )
    check(
        "PutArtifacts",
        [a.uri for a in store.get_artifacts_by_id([metrics_id])] == [f"{artifact.uri}-metrics"],
    )

    # Errors come back as MLMD's own: a type redefined with another property is refused.
    clash = pb.ArtifactType(name=art_type.name)
    clash.properties["version"] = pb.INT
    try:
        store.put_artifact_type(clash)
    except errors.AlreadyExistsError:
        check("a conflicting type is refused with ALREADY_EXISTS", True)
    else:
        check("a conflicting type is refused with ALREADY_EXISTS", False, "accepted")
    print(f"mlmd-check: all {passed} checks passed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
