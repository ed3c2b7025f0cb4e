"""A client mapping is a typed value (`client_mapping.ClientMapping`) made once from its setting: the engine and
the rows make it where they are built, and everything after reads its fields; no module parses the setting's
string again or compares a built mapping with a string."""

import re
from pathlib import Path

import pytest

from fedjax_pfl.core.errors import UserError
from fedjax_pfl.engine import client_mapping
from fedjax_pfl.engine.client_mapping import ClientMapping

PACKAGE = Path(__file__).resolve().parent.parent / "fedjax_pfl"
# where a setting's string becomes a mapping: the setting's own check, and the two places a round is built
MADE_IN = {"runs/config.py", "engine/engine.py", "engine/rows.py", "engine/client_mapping.py"}


def test_a_setting_becomes_one_typed_value():
    assert client_mapping.of("packed:3") == ClientMapping("packed", 3)
    assert client_mapping.of("chunked", 4) == ClientMapping("chunked", None, 4)
    assert client_mapping.of("map", 4).chunk_size is None  # a chunk size only where chunks are
    assert [str(client_mapping.of(s, 2)) for s in ("map", "vmap", "chunked", "packed", "packed:5")] == [
        "map", "vmap", "chunked", "packed", "packed:5"]  # written back as the setting is
    assert client_mapping.of("packed:5").packed and client_mapping.of("chunked", 2).sorts_clients
    assert not client_mapping.of("vmap").sorts_clients


def test_auto_is_the_backends_default_for_one_federation_or_several():
    for federations in (1, 3):
        want = client_mapping.default_mapping(federations=federations)
        assert str(client_mapping.of("auto", 8, federations)) == want


def test_packed_takes_its_lanes_from_the_data_once_settled():
    counts = [580, 300, 100, 100, 50, 10, 0, 60]  # 1200 steps in all, the largest 580: W 2
    bare = client_mapping.of("packed")
    assert bare.lanes is None and bare.settled(counts, 8) == ClientMapping("packed", 2)
    assert client_mapping.of("packed:7").settled(counts, 8).lanes == 7  # a given W stays
    assert client_mapping.MAP.settled(counts, 8) is client_mapping.MAP
    assert ClientMapping("packed", 7).for_pass([5] * 4, 4).lanes == 4  # a pass's lanes come from its own counts
    with pytest.raises(ValueError, match="needs its width"):
        client_mapping.map_clients(lambda loops, x: x, bare)


@pytest.mark.parametrize("setting", ["chunked:4", "packed:0", "nosuch"])
def test_a_bad_setting_is_a_one_line_user_error(setting):
    with pytest.raises(UserError, match="client mapping") as raised:
        client_mapping.of(setting)
    assert "\n" not in str(raised.value)


def test_a_built_mapping_checks_itself():
    with pytest.raises(ValueError, match="chunk_size"):
        ClientMapping("chunked")
    with pytest.raises(ValueError, match="unknown client mapping kind"):
        ClientMapping("packed:2")


COMPARED = r"\.mapping\s*[!=]=\s*[\"'][^\"']*[\"']"


def test_no_module_parses_a_mapping_again_or_compares_one_with_a_string():
    assert re.search(COMPARED, 'if engine.mapping == "chunked":')  # the scan finds what it looks for
    parsed, compared = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if re.search(r"client_mapping\.(of|parse)\(|\bof\(config\.client_mapping", text) and name not in MADE_IN:
            parsed.append(name)
        compared += [f"{name}: {m.group(0)}" for m in re.finditer(COMPARED, text)]
    assert parsed == [] and compared == [], (parsed, compared)
