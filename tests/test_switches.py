import json

import pytest
import tvm

from tvm_ascendfuse import FusionSwitches, SwitchError, known_switches
from tvm_ascendfuse.switches import GRAPH_FUSION, UB_FUSION, resolve_switches


def _names(category):
    names = sorted(n for n, i in known_switches().items() if i.category == category)
    assert len(names) >= 2, f"expected at least two {category} switches to be registered"
    return names


def test_json_form_all_and_override():
    g1, g2 = _names(GRAPH_FUSION)[:2]
    u1 = _names(UB_FUSION)[0]
    sw = FusionSwitches.from_text(json.dumps(
        {"Switch": {"GraphFusion": {"ALL": "off", g1: "on"}, "UBFusion": {u1: "off"}}}))
    assert sw.is_on(g1) and not sw.is_on(g2)
    assert not sw.is_on(u1)
    assert all(sw.is_on(n) for n in _names(UB_FUSION)[1:])


def test_flat_form_with_comments():
    g1, g2 = _names(GRAPH_FUSION)[:2]
    sw = FusionSwitches.from_text(f"# CANN flat form\nALL:off\n{g1}:on   # keep this one\n\n")
    assert sw.is_on(g1) and not sw.is_on(g2)
    assert not any(sw.is_on(n) for n in _names(UB_FUSION))


def test_unknown_name_lists_valid_ones():
    g1 = _names(GRAPH_FUSION)[0]
    with pytest.raises(SwitchError, match=r"unknown fusion pass name\(s\) NoSuchFusionPass; valid names: .*" + g1):
        FusionSwitches.from_text("NoSuchFusionPass:off")
    with pytest.raises(SwitchError, match="NoSuchFusionPass"):
        FusionSwitches.from_text(json.dumps({"Switch": {"GraphFusion": {"NoSuchFusionPass": "off"}}}))


@pytest.mark.parametrize("text,match", [
    ('{"Switch": {"GraphFusion": {', "not valid JSON"),
    ('{"Switch": {"Other": {}}}', "unknown fusion switch section 'Other'"),
    ('{"Switch": {"GraphFusion": {"ALL": "maybe"}}}', "use \"on\" or \"off\""),
    ("ALL off", "not of the form PassName:on|off"),
    ('{"Switch": {}, "Extra": 1}', "unknown top-level key"),
])
def test_malformed(text, match):
    with pytest.raises(SwitchError, match=match):
        FusionSwitches.from_text(text)


def test_wrong_section_for_name():
    g1 = _names(GRAPH_FUSION)[0]
    with pytest.raises(SwitchError, match=f"'{g1}' is a GraphFusion pass, not UBFusion"):
        FusionSwitches.from_text(json.dumps({"Switch": {"UBFusion": {g1: "off"}}}))


def test_file_errors_name_the_file(tmp_path):
    f = tmp_path / "switch.cfg"
    f.write_text("Bogus:on")
    with pytest.raises(SwitchError, match="switch.cfg"):
        FusionSwitches.from_file(f)
    with pytest.raises(SwitchError, match="cannot read fusion switch file"):
        FusionSwitches.from_file(tmp_path / "missing.cfg")


def test_python_and_pass_context():
    g1, g2 = _names(GRAPH_FUSION)[:2]
    sw = resolve_switches({g1: False})
    assert not sw.is_on(g1) and sw.is_on(g2)
    with tvm.transform.PassContext(disabled_pass=[g2]):
        merged = sw.with_pass_context()
    assert not merged.is_on(g1) and not merged.is_on(g2)
    with tvm.transform.PassContext(required_pass=[g1]):
        assert sw.with_pass_context().is_on(g1)


def test_switch_table_declares_every_pass_and_pattern_once():
    from tvm_ascendfuse.graph_fusion import GRAPH_FUSION_PASSES
    from tvm_ascendfuse.grouping import CostBasedFusionPass
    from tvm_ascendfuse.patterns import pattern_table
    from tvm_ascendfuse.switches import SWITCHES

    names = [s.name for s in SWITCHES]
    assert len(names) == len(set(names)) == len(known_switches())
    used = {cls.switch_name for cls in GRAPH_FUSION_PASSES} | {s.switch for s in pattern_table()}
    used.add(CostBasedFusionPass.switch_name)
    assert used <= set(names), used - set(names)
    assert all(known_switches()[cls.switch_name].category == GRAPH_FUSION for cls in GRAPH_FUSION_PASSES)
