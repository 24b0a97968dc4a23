"""The confusion-matrix PNG and the training curves are laid out from their labels' own widths and drawn once
(no `tight_layout` pass): every class name or tick number, axis label, title and the colour bar's label lie inside
the picture and clear of the plotted area, for small and large label sets and for tiny and large numbers."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from bertforge.data.bundled import supersense_labels
from bertforge.plotting import curve_figure
from bertforge.tasks.metrics import COUNTS_IN_CELLS_UP_TO, confusion_matrix_figure

LABEL_SETS = {
    "three": ["noun.act", "noun.animal", "verb.motion"],
    "supersense-45": supersense_labels(),
    "long-names": [f"a rather long class name number {index}" for index in range(8)],
}


def inside(box, outer) -> bool:  # noqa: ANN001
    return outer.x0 <= box.x0 and box.x1 <= outer.x1 and outer.y0 <= box.y0 and box.y1 <= outer.y1


@pytest.mark.parametrize("labels", list(LABEL_SETS))
def test_every_text_lies_inside_the_picture_and_clear_of_the_matrix(labels: str) -> None:
    names = LABEL_SETS[labels]
    matrix = np.random.default_rng(0).integers(0, 9, size=(len(names), len(names)))
    figure = confusion_matrix_figure(matrix, names, "validation confusion matrix")
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    matrix_axes, colour_bar = figure.axes
    picture, cells = figure.bbox, matrix_axes.get_window_extent(renderer)
    y_names = [label.get_window_extent(renderer) for label in matrix_axes.get_yticklabels()]
    x_names = [label.get_window_extent(renderer) for label in matrix_axes.get_xticklabels()]
    others = [text.get_window_extent(renderer) for text in (matrix_axes.xaxis.label, matrix_axes.yaxis.label,
                                                            matrix_axes.title, colour_bar.yaxis.label)]
    for box in [*y_names, *x_names, *others]:
        assert inside(box, picture), box
    assert all(box.x1 <= cells.x0 for box in y_names) and all(box.y1 <= cells.y0 for box in x_names)
    counts_in_cells = [text for text in matrix_axes.texts]
    assert len(counts_in_cells) == (matrix.size if len(names) <= COUNTS_IN_CELLS_UP_TO else 0)


CURVES = {  # metric -> values over steps 4, 8, 12: long numbers, a scale factor (lr), large counts
    "loss": [3.80185, 3.80337, 3.80521],
    "lr": [4.0e-5, 2.2e-5, 4.4e-6],
    "tokens_per_s": [120_430.0, 98_122.0, 131_004.0],
    "mfu": [0.000123, 0.000118, 0.000131],
}


@pytest.mark.parametrize("metric", list(CURVES))
def test_every_text_of_a_training_curve_lies_inside_the_picture(metric: str) -> None:
    points = {"train": list(zip([4, 8, 12], CURVES[metric], strict=True)),
              "validation": list(zip([4, 12], CURVES[metric][::2], strict=True))}
    figure = curve_figure(f"a-run: {metric}", metric, points)
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)
    (axes,) = figure.axes
    picture, area = figure.bbox, axes.get_window_extent(renderer)
    # the tick labels drawn: those of ticks within the axes (matplotlib keeps one more each side, undrawn)
    y_numbers = [box for box in (label.get_window_extent(renderer) for label in axes.get_yticklabels())
                 if area.y0 - 1 <= (box.y0 + box.y1) / 2 <= area.y1 + 1]
    x_numbers = [box for box in (label.get_window_extent(renderer) for label in axes.get_xticklabels())
                 if area.x0 - 1 <= (box.x0 + box.x1) / 2 <= area.x1 + 1]
    texts = [axes.xaxis.label, axes.yaxis.label, axes.title, axes.yaxis.get_offset_text()]
    for box in [*y_numbers, *x_numbers, *(text.get_window_extent(renderer) for text in texts if text.get_text())]:
        assert inside(box, picture), box
    assert y_numbers and all(box.x1 <= area.x0 for box in y_numbers)
