"""The synthetic workload follows the papers' length tables and is reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.scheduler.analyzer.patterns import NodeKind
from jitserve.scheduler.analyzer.workload import APP_NAMES, APPS, sample_programs, sample_requests


def test_same_seed_same_sample_other_seed_differs():
    a, b, c = sample_requests(500, seed=1), sample_requests(500, seed=1), sample_requests(500, seed=2)
    for name in ("prompt_len", "output_len", "slo_type", "max_tokens"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.output_len, c.output_len)


@pytest.mark.parametrize(
    ("app", "prompt_p50", "output_p50"),
    [("chatbot", 27, 225), ("deep_research", 403, 410)],  # JITServe Table 2, single requests
)
def test_medians_follow_the_paper_table(app, prompt_p50, output_p50):
    s = sample_requests(20_000, seed=3, apps=(app,))
    assert np.median(s.prompt_len) == pytest.approx(prompt_p50, rel=0.08)
    # user max_tokens caps truncate a few outputs, which only moves the median a little
    assert np.median(s.output_len) == pytest.approx(output_p50, rel=0.08)
    assert APPS[app].prompt.sigma > 0


def test_lengths_are_valid_and_respect_max_tokens():
    s = sample_requests(5000, seed=4)
    assert s.prompt_len.min() >= 1 and s.output_len.min() >= 1
    assert np.all(s.output_len <= s.max_tokens)
    assert set(np.unique(s.app).tolist()) == set(range(len(APP_NAMES)))
    assert set(np.unique(s.slo_type).tolist()) <= {0, 1, 3}  # single requests are never compound


def test_programs_are_valid_graphs_with_the_apps_shapes():
    programs = sample_programs(200, seed=5)
    assert all(2 <= g.num_stages <= 8 for g in programs)
    assert max(g.num_stages for g in programs) == 8
    tools = {n.identity for g in programs for n in g.nodes if n.kind is NodeKind.TOOL}
    assert tools == {"web_search", "run_tests"}
    assert sample_programs(5, seed=5)[0] == programs[0]


def test_unknown_app_is_named():
    with pytest.raises(ValueError, match="apps"):
        sample_requests(10, seed=0, apps=("nope",))
