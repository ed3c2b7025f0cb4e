"""The documentation site: a page per method with a line per option, a strict offline build, and
the docstring examples of the losses, aggregation rules and kernels, run as doctests.

The build runs `mkdocs build --strict` (the [docs] extra, part of [test]) into a temporary
folder once per session; nothing is skipped when MkDocs is missing: the test fails.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedjax_pfl.methods import registry
from fedjax_pfl.methods.options import describe

ROOT = Path(__file__).resolve().parent.parent


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks():
    return load_hooks()


@pytest.fixture(scope="module")
def pages(hooks):
    return hooks.generated_pages()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


def test_every_method_declares_its_paper_and_has_a_page(hooks, pages):
    for name, algorithm in registry().items():
        assert algorithm.paper.name and (algorithm.paper.title or algorithm.paper.note), name
        page = pages[f"methods/{name}.md"]
        assert page.startswith(f"# {algorithm.paper.name}\n"), name
        assert hooks.citation(algorithm.paper) in page, name
        for section in ("## Paper", "## Algorithm", "## Options", "## Evaluation protocol",
                        "## Differences from the paper and the authors' code", "## Reproduction results"):
            assert section in page, (name, section)


def test_every_option_has_a_line_with_its_default(hooks, pages):
    for name, cls in registry().items():
        page = pages[f"methods/{name}.md"]
        for option in describe(cls.hparams_type):
            line = next((ln for ln in page.splitlines() if ln.startswith(f"| `method.{option.name}` |")), None)
            assert line is not None, f"{name}: option {option.name} has no line on its page"
            assert f"`{hooks.cell(hooks.show_value(option.default))}`" in line, (name, option.name, line)
            assert hooks.cell(option.help) in line, (name, option.name)


def test_eval_protocols_are_on_each_page(pages):
    for name, cls in registry().items():
        section = pages[f"methods/{name}.md"].split("## Evaluation protocol", 1)[1].split("\n## ", 1)[0]
        for protocol in cls.eval_models:
            assert f"`{protocol}`" in section, (name, protocol)


def test_reproduction_rows_reach_the_method_pages(hooks, tmp_path):
    """A committed table's rows show on their methods' pages (row labels map to methods); absent: a line."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "table.md").write_text(
        "# Demo paper, Table 1: reproduced with fedjax_pfl\n\nAccuracy (%): best.\n\n"
        "| method | a paper | a fedjax_pfl |\n|---|---|---|\n| fedavg_ft | 90.00 | 89.50 ± 0.10 |\n"
        "| fedper | - | 88.00 ± 0.20 |\n")
    tables = hooks.reproduction_tables(tmp_path)
    names = registry()
    aliases = hooks.row_methods(names)
    fedavg = hooks.reproduction_section("fedavg", tables, names, aliases)
    assert "| fedavg_ft | 90.00 | 89.50 ± 0.10 |" in fedavg and "fedper" not in fedavg
    assert "Demo paper, Table 1" in fedavg
    assert hooks.reproduction_section("fedas", tables, names, aliases).startswith("No reproduction yet")
    assert hooks.reproduction_tables(tmp_path / "missing") == []


def test_grouped_paper_table_rows_reach_the_method_pages(hooks, tmp_path):
    """A table.md as `reproduce` writes it (a table per group of settings, rows labelled as the paper prints
    them, a row showing another row's runs): each method page gets its rows under each group's heading."""
    from fedjax_pfl.papers import paper_table, table_spec

    spec = table_spec.find_table("fedpac_table1")
    lines = [{"method": m.name, "label": m.shown, "group": s.group, "column": s.column, "mean": 0.9, "std": 0.01,
              "runs": 3, "status": "3 finished", "paper": spec.paper_value(m.name, s.name).mean / 100,
              "paper_std": None, "diff": 0.02, "flag": True} for m in spec.methods for s in spec.settings]
    text = paper_table.markdown(spec, lines, paper_table.header(spec, {"x": (200, 200)}, [0, 1, 2]), ["A note."])
    (tmp_path / "fedpac_table1").mkdir()
    (tmp_path / "fedpac_table1" / "table.md").write_text(text)
    tables = hooks.reproduction_tables(tmp_path)
    assert [b.heading for b in tables[0].blocks] == ["FMNIST", "CIFAR-10 (cifar10_jpeg)"]
    names = registry()
    aliases = hooks.row_methods(names)
    fedpac = hooks.reproduction_section("fedpac", tables, names, aliases)
    assert fedpac.count("| fedpac (paper) | 90.00 ± 1.00 (n=3) | 91.83 | +2.00 ⚠ |") == 1
    assert fedpac.count("| fedpac (Replicate) |") == 2 and "#### CIFAR-10 (cifar10_jpeg)" in fedpac
    assert "fedpac_proto (Modify)" not in fedpac and "A note." not in fedpac
    assert "| fedpac_proto (Modify) |" in hooks.reproduction_section("fedpac_proto", tables, names, aliases)
    assert "| fedavg_p (FedAvg-FT) |" in hooks.reproduction_section("fedavg", tables, names, aliases)


def test_cli_and_config_references_list_every_flag_and_key(pages):
    from fedjax_pfl.runs import config as config_lib

    cli = pages["reference/cli.md"]
    for module, function, _ in load_hooks().CLI_PARSERS:
        for action in getattr(importlib.import_module(module), function)()._actions:
            for flag in action.option_strings:
                assert f"`{flag}`" in cli, flag
    config = pages["reference/config.md"]
    for key in ("`train.lr`", "`partition.alpha`", "`eval.model`", "`seed`", "`model.conv_impl`"):
        assert key in config, key
    assert len(config_lib.TrainConfig.__dataclass_fields__) <= config.count("`train.")


def test_site_builds_strict_and_offline(site):
    for name, cls in registry().items():
        html = (site / "methods" / f"{name}.html").read_text(encoding="utf-8")
        for option in describe(cls.hparams_type):
            assert f"method.{option.name}" in html, (name, option.name)
    assert "class_mean_alignment" in (site / "reference" / "losses.html").read_text(encoding="utf-8")
    # nothing is fetched from elsewhere when a page is opened: no remote scripts, styles, fonts or images
    remote = re.compile(r"""<(?:script|img|iframe)[^>]*\bsrc=["']?(?:https?:)?//|<link[^>]*\bhref=["']?(?:https?:)?//""")
    for page in site.rglob("*.html"):
        assert not remote.search(page.read_text(encoding="utf-8")), f"{page} loads a remote resource"


def test_docs_point_nowhere_outside_the_repository(pages):
    """No page sends the reader to a spec outside the repository (the data folder in commands is a setting)."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")}
    texts.update(pages)
    for where, text in texts.items():
        for outside in ("shared/specs", "METHODS.md", "DESIGN.md", "PAPER_RESULTS.md"):
            assert outside not in text, (where, outside)


# ---- doctests of the pure functions ------------------------------------------------

def pure_function_modules() -> list[str]:
    import fedjax_pfl.kernels as kernels

    engine_mechanics = ["fedjax_pfl.engine.dealing", "fedjax_pfl.engine.packed_loops"]  # moved out of kernels/
    return (["fedjax_pfl.aggregation"] + [f"fedjax_pfl.kernels.{m.name}" for m in pkgutil.iter_modules(kernels.__path__)]
            + engine_mechanics)


# engine modules some of whose functions carry an example (the engine's mechanics, not all pure functions)
SOME_EXAMPLES = ["fedjax_pfl.engine.client_mapping", "fedjax_pfl.engine.mapping_choice"]


@pytest.mark.parametrize("name", pure_function_modules() + SOME_EXAMPLES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE, verbose=False, report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"


@pytest.mark.parametrize("name", pure_function_modules())
def test_every_public_function_has_an_example(name):
    module = importlib.import_module(name)
    missing = [n for n, f in vars(module).items()
               if inspect.isfunction(f) and f.__module__ == name and not n.startswith("_")
               and ">>>" not in (f.__doc__ or "")]
    assert not missing, f"{name}: public functions without a docstring example: {missing}"


def test_losses_face_reexports_only_functions_with_examples():
    import fedjax_pfl.losses as losses

    for n in losses.__all__:
        assert ">>>" in (getattr(losses, n).__doc__ or ""), n


def test_readme_lists_every_method_with_its_module(hooks):
    """README's methods table is the one the declarations generate (`python docs/hooks.py readme` rewrites it):
    a row per method, linked to the file that declares it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert hooks.readme_with_methods_table(readme, registry()) == readme, \
        "README's methods table differs from the declarations: run python docs/hooks.py readme"
    for name, algorithm in registry().items():
        module = algorithm.module.replace(".", "/") + ".py"
        assert f"]({module}) | `{name}` |" in readme, f"README's methods table has no row for {name}"
        assert (ROOT / module).is_file(), module


def test_readme_stays_under_120_lines_with_its_two_commands():
    """A newcomer reads the README in one sitting: under 120 lines, the install-and-train and
    install-and-test commands among them, the test command the one CI runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) < 120, f"README.md has {len(readme)} lines"
    test_command = 'pip install -e ".[test]" && FEDJAX_PFL_DATA_DIR=../shared/data python -m pytest -q -n 2'
    assert test_command in readme and "python -m pytest -q -n 2" in (ROOT / ".ci" / "run").read_text()
    assert any(line.startswith("pip install -e") and "python -m fedjax_pfl.train --method fedas" in line
               for line in readme)


def test_method_docstrings_leave_the_option_list_to_the_declarations():
    """A method page lists its options from the options dataclass; a hand-written list in the module docstring
    would drift from it."""
    from fedjax_pfl.methods import registry

    by_hand = sorted({algorithm.module for algorithm in registry().values()
                      if "Options (``method.<name>=value``)" in algorithm.doc})
    assert not by_hand, f"option lists written by hand in: {by_hand}"


# ---- the reliability page and the site opened from the file system -------------------

def test_the_bad_input_table_is_every_case_the_tests_check(hooks, site):
    """The reliability page's table comes from tests/bad_input_cases.py, the list the tests assert: every case
    with its exit status and its exact message, on the built page."""
    cases = hooks.bad_input_cases()
    table = hooks.bad_inputs_table()
    html = (site / "concepts" / "reliability.html").read_text(encoding="utf-8")
    for case in cases.CASES_LIST:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{case.name}` |"))
        assert f"| {case.exit} | {hooks.cell(hooks.escape_html(case.message))} |" in row, case.name
        assert f"<code>{case.name}</code>" in html, case.name
    assert "<!-- generated" not in html


SEARCH_FROM_A_FILE = r"""
const fs = require("fs"), vm = require("vm");
const [site, query] = process.argv.slice(1);  // (node -e: the arguments follow the program)
const results = {innerHTML: "Searching...", getAttribute: () => null};
const input = {value: "", addEventListener: () => {}};
const context = {base_url: "."};
context.window = {location: {protocol: "file:", search: "?q=" + encodeURIComponent(query)}};
context.document = {
  readyState: "complete",
  getElementById: (id) => ({"mkdocs-search-results": results, "mkdocs-search-query": input})[id] || null,
  createElement: () => ({}),
  head: {appendChild: (script) => {  // a page opened from the file system may load a script, nothing else
    vm.runInContext(fs.readFileSync(site + "/" + script.src, "utf8"), context);
    script.onload();
  }},
};
vm.createContext(context);
vm.runInContext(fs.readFileSync(site + "/javascripts/offline_search.js", "utf8"), context);
process.stdout.write(results.innerHTML);
"""


def test_search_answers_on_the_site_opened_from_the_file_system(site):
    """Opened as site/index.html (file://), the search page loads the index as a script and lists the pages
    holding every word of the query (MkDocs' own search needs a web worker and XMLHttpRequest, which a page at
    file:// does not get, and stayed on "Searching...")."""
    assert (site / "search" / "search_index.js").read_text(encoding="utf-8").startswith(
        "window.FEDJAX_PFL_SEARCH_INDEX = {")
    found = subprocess.run(["node", "-e", SEARCH_FROM_A_FILE, str(site), "start-over resume"], capture_output=True,
                           text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert 'href="./concepts/reliability.html' in found.stdout and "Searching" not in found.stdout, found.stdout[:500]
    nothing = subprocess.run(["node", "-e", SEARCH_FROM_A_FILE, str(site), "zzyzxnotaword"], capture_output=True,
                             text=True, timeout=60)
    assert nothing.stdout == "<p>No results found</p>", nothing.stdout
