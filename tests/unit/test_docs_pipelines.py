"""Every pipeline docs/kfp.md shows compiles with KFP's own compiler, as a user's copy of it would
(issue 62, item 1: the page's own-pipeline example did not run); a block that fails names its
line. The own-pipeline example takes its table as an artifact, so its preprocess step needs no
store secret, and gives evaluate the registry's account."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import yaml

from tests.docs_pipelines import (
    KFP_PAGE,
    compile_block,
    compile_own_pipeline,
    pipeline_blocks,
    python_blocks,
)

BLOCKS = pipeline_blocks()


def test_the_page_shows_pipelines() -> None:
    assert BLOCKS, f"no ```python block of {KFP_PAGE} defines a pipeline"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_each_pipeline_block_compiles(block, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    try:
        found = compile_block(block, tmp_path / "pipeline.yaml")
    except Exception as e:  # any failure is the block's, reported with its line
        pytest.fail(f"{block.where}: the block does not compile: {type(e).__name__}: {e}")
    assert found, f"{block.where}: the block defines no pipeline"


def test_the_own_pipeline_reads_the_table_as_an_artifact_with_no_store_secret(
    tmp_path: Path,
) -> None:
    docs = list(yaml.safe_load_all(compile_own_pipeline(tmp_path / "own.yaml").read_text()))
    spec, platform = docs[0], (docs[1] if len(docs) > 1 else {})
    tasks = spec["root"]["dag"]["tasks"]
    assert spec["pipelineInfo"]["name"] == "my-churn-pipeline"
    prep = tasks["preprocess"]["inputs"]
    assert prep["artifacts"]["data"]["taskOutputArtifact"] == {
        "outputArtifactKey": "table",
        "producerTask": "make-table",
    }
    assert "data_uri" not in prep.get("parameters", {})
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-evaluate"}, "only evaluate takes a secret (the registry's)"
    (secret,) = executors["exec-evaluate"]["secretAsEnv"]
    assert secret["secretName"] == "mlflow-auth" and secret["optional"] is True
    # The shipped component.yaml files are what the page loads, not the Python functions.
    comps = spec["components"]
    assert comps["comp-preprocess"]["inputDefinitions"]["artifacts"]["data"]["isOptional"] is True


def test_a_broken_block_is_named_by_its_line_on_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n```python\nprint('not a pipeline')\n```\n\nText.\n\n```python\n"
        "from kfp import dsl\n\n\n@dsl.pipeline\ndef broken():\n    no_such_component()\n```\n"
    )
    assert [b.line for b in python_blocks(page)] == [4, 10]
    (block,) = pipeline_blocks(page)
    assert block.where.endswith("page.md:10")
    with pytest.raises(NameError) as e:
        compile_block(block, tmp_path / "broken.yaml")
    # The traceback points at the page's own line of the call.
    assert traceback.extract_tb(e.value.__traceback__)[-1].lineno == 15
