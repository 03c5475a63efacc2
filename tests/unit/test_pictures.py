"""The documentation's pictures come from the real things: the compiled pipeline's graph and the
plots a real report embeds."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from pipelines.pictures import draw_pipeline, pipeline_tasks, report_images

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled() -> dict:
    return next(yaml.safe_load_all((ROOT / "pipelines/compiled/gpupipe-training.yaml").read_text()))


def test_the_graph_is_the_compiled_pipelines(compiled: dict) -> None:
    tasks = pipeline_tasks(compiled)
    edges = {(dep, t.label) for t in tasks.values() for dep in (tasks[d].label for d in t.after)}
    assert edges == {
        ("fingerprint", "preprocess"),
        ("preprocess", "tune"),
        ("tune", "train"),
        ("tune", "train (cluster job)"),
        ("train", "evaluate"),
        ("train (cluster job)", "evaluate"),
        ("evaluate", "register"),
        ("register", "notify"),
    }
    by_label = {t.label: t for t in tasks.values()}
    assert "gate-passed" in by_label["register"].groups
    assert "cached" in by_label["preprocess"].notes
    assert by_label["notify"].groups == []  # the exit handler, outside the training group


def test_the_graph_is_drawn(compiled: dict, tmp_path: Path) -> None:
    out = draw_pipeline(compiled, tmp_path / "pipeline.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_reports_plots_are_taken_out_by_their_alt_text() -> None:
    png = b"\x89PNG\r\n\x1a\nrest"
    page = (
        f'<p>x</p><img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
        'alt="ROC curve"><img src="data:image/png;base64,AAAA" alt="Confusion &amp; matrix">'
    )
    images = report_images(page)
    assert images["roc-curve"] == png
    assert set(images) == {"roc-curve", "confusion-matrix"}


def test_the_layers_are_read_from_the_imports(tmp_path: Path) -> None:
    from pipelines.pictures import draw_layers, import_graph, layer_of

    root = Path(__file__).resolve().parents[2]
    graph = import_graph(root)
    layers = layer_of(graph)
    assert layers["trainer.base"] == 0 and layers["pipelines"] == max(layers.values())
    assert {"trainer.steps", "trainer.launch", "components"} <= graph["pipelines"]
    for part, deps in graph.items():
        assert all(layers[part] > layers[d] for d in deps), (part, deps)
    with pytest.raises(ValueError, match="an import cycle: a -> b -> a"):
        layer_of({"a": {"b"}, "b": {"a"}})
    out = draw_layers(root, tmp_path / "layers.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
