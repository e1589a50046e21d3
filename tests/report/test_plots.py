"""Figures a newcomer reads first: no one-point lines, no lines up and down one x, no offset
tick labels, no empty panels, axes that start where the values do."""

from __future__ import annotations

from matplotlib.lines import Line2D

from dsv4bench.report import plots


def _lines(ax) -> list[Line2D]:
    """Lines that join two or more data points (axhline/axvline excluded)."""
    return [
        ln
        for ln in ax.get_lines()
        if ln.get_linestyle() not in ("None", "none", "")
        and len(ln.get_xdata()) > 1
        and ln.get_transform() == ax.transData
    ]


def _tick_texts(fig, axis: str) -> list[str]:
    fig.canvas.draw()
    return [
        t.get_text()
        for ax in fig.axes
        if ax.get_visible()
        for t in getattr(ax, f"get_{axis}ticklabels")()
    ]


def test_one_point_series_become_a_labelled_dot_chart(tmp_path):
    series = [
        plots.Series("torch s_q=1 8 heads", [2], [0.0098211]),
        plots.Series("torch s_q=2 8 heads", [2], [0.0098213]),
        plots.Series("reference-f64 s_q=1 8 heads", [], [], failed_xs=[2]),
    ]
    panel = plots.Panel("achieved TFLOP/s", "batch size (requests)", "TFLOP/s", series)
    assert plots.is_point_figure([panel])
    fig = plots.line_figure("t", [panel])
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert not _lines(ax)  # markers only: nothing joins points
    assert [t.get_text() for t in ax.get_yticklabels()] == [s.label for s in series]
    assert ax.get_title() == "achieved TFLOP/s at batch size 2"  # the shared x, said once
    assert ax.get_xlabel() == "TFLOP/s" and ax.get_xlim()[0] == 0
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("0.00982") == 2  # each value written beside its dot
    assert ax.xaxis.get_offset_text().get_text() == ""
    plots.save(fig, tmp_path / "dots.png")


def test_one_point_series_at_different_sizes_name_their_size():
    series = [plots.Series("a", [1], [3.0]), plots.Series("b", [4], [5.0])]
    fig = plots.line_figure("t", [plots.Panel("p", "chunk tokens", "ms", series)])
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert ax.get_title() == "p"
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "a (chunk tokens 1)",
        "b (chunk tokens 4)",
    ]


def test_a_point_measured_twice_is_not_a_vertical_line():
    s = plots.Series("triton ctx 8K", [1, 1, 2, 4], [2.2, 14.0, 28.0, 40.0])
    fig = plots.line_figure("t", [plots.Panel("p", "batch", "TFLOP/s", [s])])
    ax = fig.axes[0]
    (line,) = _lines(ax)
    assert list(line.get_xdata()) == [1, 2, 4]  # one value per x: nothing runs up and down
    assert list(line.get_ydata()) == [2.2, 28.0, 40.0]  # the lower median at x=1
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() == "none"]
    assert [list(h.get_ydata()) for h in hollow] == [[14.0]]  # the other reading stays visible
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("measured again" in t for t in legend)


def test_linear_axes_have_plain_labels_and_start_at_zero():
    close = plots.Series("a", [1, 2], [0.0098111, 0.0098113])  # an offset label before
    zeros = plots.Series("b", [1024, 4096], [0.0, 0.0])
    fig = plots.line_figure(
        "t", [plots.Panel("p", "x", "y", [close]), plots.Panel("q", "x", "y", [zeros])]
    )
    labels = _tick_texts(fig, "y")
    assert all("e-" not in t and "+" not in t for t in labels if t), labels
    for ax in fig.axes[:2]:
        assert ax.yaxis.get_offset_text().get_text() == ""
        assert ax.get_ylim()[0] == 0
    assert fig.axes[1].get_ylim() == (0, 1)  # all zero: on the floor of a 0..1 axis


def test_a_single_size_gets_one_tick_not_a_made_up_range():
    series = [plots.Series("a", [2, 2], [1.0, 1.5]), plots.Series("b", [8, 16], [1.0, 2.0])]
    fig = plots.line_figure(
        "t", [plots.Panel("p", "x", "y", series[:1]), plots.Panel("q", "x", "y", series[1:])]
    )
    ax = fig.axes[0]
    assert list(ax.get_xticks()) == [2] and ax.get_xlim() == (1, 4)


def test_dot_rows_sharing_a_label_keep_what_told_their_lines_apart():
    series = [
        plots.Series("chunk 4K", [64], [1.5], linestyle="-"),
        plots.Series("chunk 4K", [64], [0.8], linestyle="--"),
    ]
    fig = plots.line_figure("t", [plots.Panel("p", "heads", "ratio", series)])
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "chunk 4K (solid line)",
        "chunk 4K (dashed line)",
    ]


def test_a_dot_chart_of_long_shared_labels_keeps_its_panels_and_one_label_column(tmp_path):
    import warnings

    labels = [
        f"flashinfer-0.7.2.post1 s_q=1 edge=graph-pad-sglang graph_batch=8 #{i}" for i in range(40)
    ]
    panels = [
        plots.Panel(
            title,
            "batch size (requests)",
            unit,
            [plots.Series(lab, [3], [50.0 + i]) for i, lab in enumerate(labels)],
        )
        for title, unit in (("achieved TFLOP/s", "TFLOP/s"), ("fraction of peak", "fraction"))
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied ... collapsed to zero"
        fig = plots.line_figure("t", panels)
        plots.save(fig, tmp_path / "dots.png")
    first, second = [a for a in fig.axes if a.get_visible()]
    assert [t.get_text() for t in first.get_yticklabels()] == labels
    assert not any(t.get_visible() and t.get_text() for t in second.get_yticklabels())


def test_a_row_of_several_values_writes_them_once():
    series = [plots.Series("fa3", [64, 64], [0.537, 0.564])]
    panel = plots.Panel("fraction of peak", "chunk tokens", "fraction", series, ypercent=True)
    fig = plots.line_figure("t", [panel])
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert [t.get_text() for t in ax.texts] == ["53.7%, 56.4%"]  # not two texts on one spot


def test_what_matplotlib_warns_goes_into_the_report_not_the_terminal(tmp_path, monkeypatch):
    import warnings

    from dsv4bench.report import render
    from tests.factories import write_run
    from tests.report.test_compare import base_rows

    def warns(rep):
        warnings.warn("constrained_layout not applied", UserWarning, stacklevel=1)

    monkeypatch.setattr(render, "SECTIONS", (warns, *render.SECTIONS))
    run = write_run(tmp_path / "run", base_rows())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one that escaped would raise here
        render.build_report([run], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "matplotlib warned 1x: UserWarning: constrained_layout not applied" in md
