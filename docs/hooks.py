"""MkDocs hooks: the pages generated from the code at build time, so they cannot drift.

Generated (nothing is written into docs/; the pages exist only in the build):

- ``methods/index.md`` and ``methods/<name>.md``: one page per registered
  method (`fedjax_pfl.methods.registry`), all from its declaration
  (``Algorithm`` in its file): its paper (``paper``), algorithm and notes (the
  declaring module's docstring), options (`fedjax_pfl.methods.options.describe`),
  evaluation protocols (``eval_models``) and the committed reproduction tables
  that list it;
- ``reference/cli.md`` from the commands' argument parsers and
  ``reference/config.md`` from the run configuration dataclasses;
- ``reference/kernels/<module>.md``: one mkdocstrings page per kernel module;
- ``reproductions/index.md`` and one page per ``reproductions/<table>/table.md``;
- ``benchmarks/results.md`` from ``benchmarks/RESULTS.md``;
- the bad-input table of ``concepts/reliability.md`` from ``tests/bad_input_cases.py``, the list of
  cases (exit status and exact message) that the tests check;
- ``stylesheets/pygments.css`` (the code highlighting's colours, from Pygments) and, after the build,
  ``search/search_index.js``: the search index as a script, which the search page loads when the site
  is opened from the file system (docs/javascripts/offline_search.js).

The page builders are plain functions of the code (tests/test_docs.py calls
them); `on_config` adds the generated pages to the navigation and `on_files`
hands them to MkDocs. This file must not import MkDocs at module level (the
test imports it without building) nor write into the source tree while
building. Run as a script, ``python docs/hooks.py readme`` rewrites the
README's methods table from the declarations (`readme_methods_table`; the test
fails while the committed table differs).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import inspect
import pkgutil
import re
import sys
import typing
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the checkout's own fedjax_pfl, whatever is installed
    sys.path.insert(0, str(ROOT))

# The one place that names the command-line parsers (module, function, command);
# re-point here when a command moves.
CLI_PARSERS = (
    ("fedjax_pfl.commands.train", "build_parser", "python -m fedjax_pfl.train"),
    ("fedjax_pfl.cells.reproduce", "build_parser", "python -m fedjax_pfl.reproduce"),
    ("fedjax_pfl.commands.report", "build_parser", "python -m fedjax_pfl.report"),
)
RUN_CONFIG = "fedjax_pfl.runs.config"
README = ROOT / "README.md"
# The README's methods table stands between these lines (`readme_with_methods_table`).
README_TABLE_START = "<!-- methods table: generated from the declarations by `python docs/hooks.py readme` -->"
README_TABLE_END = "<!-- end of methods table -->"
REPRODUCTIONS = ROOT / "reproductions"
TABLE_SPECS = ROOT / "configs" / "tables"
BENCHMARK_RESULTS = ROOT / "benchmarks" / "RESULTS.md"
BAD_INPUT_CASES = ROOT / "tests" / "bad_input_cases.py"
SEARCH_SCRIPT_VARIABLE = "FEDJAX_PFL_SEARCH_INDEX"  # docs/javascripts/offline_search.js reads it
CONVENTIONS_PAGE = "methods/conventions.md"

# What each evaluation protocol (``eval.model``) evaluates; the concepts page explains them.
EVAL_MODELS = {
    "global": "the current global model (for body-sharing methods: the global body with the client's own head)",
    "local": "the client's own model after its last local training",
    "global_adapted": "the global model after a few gradient steps on the client's train data",
    "global_knn": "the global model mixed with a k-nearest-neighbour memory of the client's train features",
    "local_ala": "the client's adaptive local aggregation of its own model and the current global model",
}


# ---- small helpers ---------------------------------------------------------------


def methods() -> dict:
    from fedjax_pfl.methods import registry

    return registry()


def cell(text) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def show_value(value) -> str:
    """A default as a user writes it on the command line (YAML scalars)."""
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(show_value(v) for v in value) + "]"
    return str(value)


def docstring_markdown(text: str) -> str:
    """A plain-text docstring as Markdown: lists get the blank line Markdown needs, '<' is escaped."""
    out: list[str] = []
    in_list = False
    for line in inspect.cleandoc(text or "").splitlines():
        if re.match(r"^\s+\+ ", line):  # an indented '+ term' continues a formula, not a list
            line = line.replace("+", "\\+", 1)
        item = re.match(r"^\s*(?:[-*]|\d+\.) ", line) is not None
        if not line.strip():
            in_list = False
        elif item and not in_list:
            if out and out[-1].strip():
                out.append("")
            in_list = True
        out.append(escape_html(line))
    return "\n".join(out)


def escape_html(line: str) -> str:
    """'<' outside code spans as an entity (inside them Markdown shows text as it is)."""
    pieces = re.split(r"(`+[^`]*`+)", line)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in pieces)


# A line at the margin that opens a new note, even inside a paragraph.
_OPENERS = ("Evaluation", "Options (", "Where ", "Choices", "Followed from", "From the authors", "Not followed",
            "Not implemented", "Hyperparameters", "The authors", "Presets:")


def docstring_blocks(text: str) -> list[str]:
    """Paragraphs of a docstring, also split where a line at the margin opens a new note (_OPENERS)."""
    blocks: list[list[str]] = [[]]
    for line in inspect.cleandoc(text or "").splitlines():
        if not line.strip():
            blocks.append([])
        elif line.startswith(_OPENERS) and blocks[-1]:
            blocks.append([line])
        else:
            blocks[-1].append(line)
    return ["\n".join(b) for b in blocks if b]


def split_docstring(text: str) -> dict[str, list[str]]:
    """The docstring's blocks sorted into algorithm, evaluation, options and differences.

    The algorithm is what comes before the first note that opens with one of _OPENERS
    (where, choices, the authors' code, ...); the blocks from there on are the differences,
    except evaluation and options notes, which go to their own sections wherever they stand.
    """
    parts: dict[str, list[str]] = {"algorithm": [], "evaluation": [], "options": [], "differences": []}
    notes = False
    for block in docstring_blocks(text):
        if block.startswith("Evaluation"):
            parts["evaluation"].append(block)
        elif block.startswith("Options ("):
            parts["options"].append(block)
        else:
            notes = notes or block.startswith(_OPENERS)
            parts["differences" if notes else "algorithm"].append(block)
    return parts


def conventions_links(markdown: str, page: str) -> str:
    """Mentions of the conventions page (docs/methods/conventions.md) become links to it."""
    target = Path(CONVENTIONS_PAGE).relative_to(Path(page).parent) if page.startswith("methods/") else CONVENTIONS_PAGE
    return re.sub(r"docs/methods/conventions\.md", f"[the method conventions]({target})", markdown)


def citation(paper) -> str:
    """A method's `Paper` as the page cites it (its note alone for a method without a paper)."""
    if not paper.title:
        return paper.note
    year = (", " if " " in paper.venue else " ") + str(paper.year) if paper.year else ""
    text = f"{paper.authors}. **[{paper.title}]({paper.url})**. {paper.venue}{year}."
    if paper.code:
        text += f"  \nThe authors' code: `{paper.code}` (GitHub)."
    if paper.note:
        text += f"\n\n{paper.note}"
    return text


def source_path(algorithm) -> str:
    """The file that declares ``algorithm``, relative to the checkout when it is inside it."""
    path = Path(sys.modules[algorithm.module].__file__).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()


# ---- reproduction tables ---------------------------------------------------------


@dataclasses.dataclass
class TableBlock:
    heading: str  # the '## ' heading above it ('' when none)
    header: list[str]  # the table's header and delimiter rows
    rows: dict[str, str]  # row label -> the row's Markdown line


@dataclasses.dataclass
class ReproductionTable:
    folder: str  # reproductions/<folder>/table.md
    title: str
    notes: list[str]  # the lines between the title and the first table or heading
    blocks: list[TableBlock]  # its Markdown tables (one per group of settings)
    text: str

    @property
    def page(self) -> str:
        return f"reproductions/{self.folder}.md"


def parse_table(folder: str, text: str) -> ReproductionTable:
    """A table.md (papers/paper_table.py): title, the lines before the first table, and each table under its
    '## ' heading."""
    lines = text.splitlines()
    title = next((ln[2:].strip() for ln in lines if ln.startswith("# ")), folder)
    notes, blocks, heading, table = [], [], "", []
    for ln in [*lines, ""]:
        if ln.startswith("|"):
            table.append(ln)
            continue
        if table:
            blocks.append(TableBlock(heading, table[:2], {r.split("|")[1].strip(): r for r in table[2:]}))
            table = []
        if ln.startswith("## "):
            heading = ln[3:].strip()
        elif ln.strip() and not ln.startswith("# ") and not blocks and not heading:
            notes.append(ln)
    return ReproductionTable(folder, title, notes, blocks, text)


def reproduction_tables(root: Path = REPRODUCTIONS) -> list[ReproductionTable]:
    if not root.is_dir():
        return []
    return [parse_table(p.parent.name, p.read_text(encoding="utf-8")) for p in sorted(root.glob("*/table.md"))]


def row_methods(names) -> dict[str, str]:
    """Row name or label of a paper table (configs/tables/*.yaml) -> the registered method it runs."""
    found = {}
    for path in sorted(TABLE_SPECS.glob("*.yaml")):
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        rows = [r for r in spec.get("methods", []) if isinstance(r, dict) and "name" in r]
        runs = {r["name"]: r.get("method", r["name"]) for r in rows if "runs_of" not in r}
        for row in rows:
            method = runs.get(row.get("runs_of"), row["name"]) if "runs_of" in row else runs[row["name"]]
            found[row["name"]] = method
            if "label" in row:
                found[str(row["label"])] = method
    return {label: m for label, m in found.items() if m in names}


def method_of_row(label: str, names, aliases: dict[str, str]) -> str | None:
    if label in names:
        return label
    if label in aliases:
        return aliases[label]
    prefixes = [n for n in names if label.startswith(n + "_")]
    return max(prefixes, key=len) if prefixes else None


def reproduction_section(name: str, tables: list[ReproductionTable], names, aliases) -> str:
    parts = []
    for t in tables:
        found = []
        for b in t.blocks:
            rows = [line for label, line in b.rows.items() if method_of_row(label, names, aliases) == name]
            if rows:
                found += [*([f"#### {b.heading}", ""] if b.heading else []), *b.header, *rows, ""]
        if found:
            parts.append("\n".join([f"### {t.title}", "", *t.notes, "", *found,
                                    f"The whole table, with its notes: [{t.folder}](../{t.page})."]))
    if not parts:
        return ("No reproduction yet: no committed table under `reproductions/` lists this method. "
                "`python -m fedjax_pfl.reproduce --list` shows the paper tables that can be run.")
    return "\n\n".join(parts)


# ---- pages -----------------------------------------------------------------------


def options_table(algorithm) -> str:
    from fedjax_pfl.methods.options import describe

    infos = describe(algorithm.hparams_type)
    if not infos:
        return "This method has no options of its own; the run settings (`train.*`, `eval.model`) apply."
    lines = ["| option | type | default | allowed | help |", "|---|---|---|---|---|"]
    for o in infos:
        lines.append(f"| `method.{o.name}` | {cell(o.type)} | `{cell(show_value(o.default))}` | "
                     f"{cell(o.allowed) or 'any'} | {cell(o.help)} |")
    example = f"{infos[0].name}={show_value(infos[0].default)}"
    lines += ["", f"Set on the command line as `--method {algorithm.name} method.{example}` or under `method:` in a "
              "YAML preset; `--method " + algorithm.name + " --help` prints the same list."]
    return "\n".join(lines)


def evaluation_section(algorithm, notes: list[str]) -> str:
    """The protocols the method offers; described generically only where it offers several (its
    docstring's evaluation note says what a single protocol evaluates)."""
    default, *others = algorithm.eval_models
    if others:
        lines = [f"Default `eval.model`: `{default}`, {EVAL_MODELS.get(default, default)}.",
                 "Also offered: " + "; ".join(f"`{m}`, {EVAL_MODELS.get(m, m)}" for m in others) + "."]
    else:
        lines = [f"`eval.model`: `{default}`, the only protocol this method offers (`auto` selects it)."]
    lines.append("See [evaluation protocols](../concepts/evaluation.md).")
    return "\n\n".join([" ".join(lines), *map(docstring_markdown, notes)])


def method_page(name: str, algorithm, tables: list[ReproductionTable], names, aliases) -> str:
    """The page of the method ``algorithm`` declares, from its declaration alone."""
    parts = split_docstring(algorithm.doc)
    steps = "\n\n".join(docstring_markdown(b) for b in parts["algorithm"])
    differences = "\n\n".join(docstring_markdown(b) for b in parts["differences"]) or (
        "The docstring records no difference from the paper or the authors' code.")
    options = options_table(algorithm)
    if parts["options"]:
        options += "\n\n" + "\n\n".join(docstring_markdown(b) for b in parts["options"])
    text = "\n".join([
        f"# {algorithm.paper.name}",
        "",
        f"`--method {name}` · declared in `{source_path(algorithm)}`",
        "",
        "## Paper",
        "",
        citation(algorithm.paper),
        "",
        "## Algorithm",
        "",
        steps,
        "",
        "## Options",
        "",
        options,
        "",
        "## Evaluation protocol",
        "",
        evaluation_section(algorithm, parts["evaluation"]),
        "",
        "## Differences from the paper and the authors' code",
        "",
        differences,
        "",
        "## Reproduction results",
        "",
        reproduction_section(name, tables, names, aliases),
        "",
    ])
    return conventions_links(text, f"methods/{name}.md")


def methods_index(registry: dict) -> str:
    lines = ["# Methods", "",
             f"{len(registry)} methods, one file each under `fedjax_pfl/methods/`. Each page is generated from "
             "the method's declaration: its paper, its module's docstring, the options it declares and the "
             "evaluation protocols it offers. The shared conventions (body/head split, sampling, stragglers, "
             "evaluation) are on [method conventions](conventions.md); how a method is written: "
             "[architecture](../architecture.md#the-method-contract).", "",
             "| method | `--method` | paper | options | default `eval.model` |", "|---|---|---|---|---|"]
    from fedjax_pfl.methods.options import describe

    for name, algorithm in registry.items():
        lines.append(f"| [{cell(algorithm.paper.name)}]({name}.md) | `{name}` | {cell(algorithm.paper.where)} | "
                     f"{len(describe(algorithm.hparams_type))} | `{algorithm.eval_models[0]}` |")
    return "\n".join(lines) + "\n"


def readme_methods_table(registry: dict) -> str:
    """The README's methods table: each method's name linked to its file, its ``--method`` and its venue."""
    lines = ["| method | `--method` | paper |", "|---|---|---|"]
    for name, algorithm in registry.items():
        lines.append(f"| [{cell(algorithm.paper.name)}]({source_path(algorithm)}) | `{name}` | "
                     f"{cell(algorithm.paper.where)} |")
    return "\n".join(lines)


def readme_with_methods_table(text: str, registry: dict) -> str:
    """``text`` (the README) with the table between `README_TABLE_START` and `README_TABLE_END` regenerated."""
    if README_TABLE_START not in text or README_TABLE_END not in text:
        raise ValueError(f"the README lacks the lines {README_TABLE_START!r} and {README_TABLE_END!r}")
    head, rest = text.split(README_TABLE_START, 1)
    _, tail = rest.split(README_TABLE_END, 1)
    return f"{head}{README_TABLE_START}\n{readme_methods_table(registry)}\n{README_TABLE_END}{tail}"


def eval_models_table(registry: dict) -> str:
    """Each protocol: the methods whose default it is, and those that also offer it."""
    rows = ["| `eval.model` | default for | also offered by |", "|---|---|---|"]
    for protocol in dict.fromkeys(m for cls in registry.values() for m in cls.eval_models):
        default = [n for n, c in registry.items() if c.eval_models[0] == protocol]
        other = [n for n, c in registry.items() if protocol in c.eval_models[1:]]
        rows.append(f"| `{protocol}` | " + ", ".join(f"[`{n}`](../methods/{n}.md)" for n in default)
                    + " | " + ", ".join(f"[`{n}`](../methods/{n}.md)" for n in other) + " |")
    return "\n".join(rows)


# Markers in the hand-written pages that the hooks replace with generated text.
MARKERS = {"<!-- generated: eval-models -->": lambda: eval_models_table(methods()),
           "<!-- generated: kernel-list -->": lambda: kernel_list(),
           "<!-- generated: bad-inputs -->": lambda: bad_inputs_table()}


def bad_input_cases():
    """tests/bad_input_cases.py, the one list of bad inputs the tests check (loaded by path: tests/ is no
    package)."""
    if "bad_input_cases" in sys.modules:  # (the tests import it by its name)
        return sys.modules["bad_input_cases"]
    spec = importlib.util.spec_from_file_location("bad_input_cases", BAD_INPUT_CASES)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks its module up while it is made)
    spec.loader.exec_module(module)
    return module


def bad_inputs_table() -> str:
    """Every case of tests/bad_input_cases.py: what is given, the command, its exit status and its message."""
    cases = bad_input_cases()
    lines = ["Placeholders in the commands and messages:", ""]
    lines += [f"- `{{{name}}}`: {escape_html(text)}" for name, text in cases.PLACEHOLDERS.items()]
    lines += ["", "| case | what is given | command | exit | message |", "|---|---|---|---|---|"]
    for case in cases.CASES_LIST:
        lines.append(f"| `{case.name}` | {cell(escape_html(case.given))} | `{cell(case.shown_command())}` | "
                     f"{case.exit} | {cell(escape_html(case.message))} |")
    return "\n".join(lines)


def config_rows() -> list[tuple[str, str, str, str, str]]:
    """(key, type, default, allowed, help) of every run setting, from its one declaration (runs/config.py)."""
    config_lib = importlib.import_module(RUN_CONFIG)
    from fedjax_pfl.core.declared import shown

    return [(key, info.type, shown(info.default), info.allowed, info.help) for key, info in config_lib.declarations()]


def config_page() -> str:
    lines = ["# Run configuration", "",
             "Every run is one configuration: defaults below, then a YAML preset (`--config`), then flags, then "
             "dotted overrides `key.sub=value` (anywhere among the flags; values are YAML scalars). "
             "`config.json` in each run folder records the resolved values. The method's own options "
             "(`method.<name>`) are on each [method's page](../methods/index.md). Generated from the "
             f"declarations in `{RUN_CONFIG}` (the flags, their help and the checks come from the same ones).", ""]
    rows = config_rows()
    for section in dict.fromkeys(key.split(".")[0] if "." in key else "" for key, *_ in rows):
        lines += [f"## `{section or 'top level'}`", "", "| key | type | default | allowed | note |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{key}` | {cell(kind)} | `{cell(default)}` | {cell(allowed)} | {cell(note)} |"
                  for key, kind, default, allowed, note in rows
                  if (key.split(".")[0] if "." in key else "") == section]
        lines.append("")
    return "\n".join(lines)


def parser_section(parser: argparse.ArgumentParser, command: str) -> str:
    lines = [f"## `{command}`", "", parser.description or "", "", "| option | argument | help | choices |",
             "|---|---|---|---|"]
    for action in parser._actions:
        flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        arg = "" if action.nargs == 0 else (action.metavar or action.dest.upper())
        choices = ", ".join(map(str, action.choices)) if action.choices else ""
        lines.append(f"| {flags} | {cell(arg)} | {cell(action.help or '')} | {cell(choices)} |")
    lines += ["", "The full `--help`:", "", "```text", parser.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def cli_page() -> str:
    lines = ["# Command line", "",
             "Generated from the commands' argument parsers. Flags set the run configuration; every other key of "
             "it is reachable as a dotted override (`train.lr=0.1`, `method.mu=0.01`): see "
             "[run configuration](config.md). Bad input prints one line starting with `error:` and exits 2.", ""]
    for module, function, command in CLI_PARSERS:
        parser = getattr(importlib.import_module(module), function)()
        parser.prog = command
        lines.append(parser_section(parser, command))
    return "\n".join(lines)


def kernel_modules() -> list[str]:
    import fedjax_pfl.kernels as kernels

    return sorted(i.name for i in pkgutil.iter_modules(kernels.__path__) if not i.name.startswith("_"))


def kernel_list() -> str:
    """A line per kernel module: its link and the first line of its docstring."""
    lines = []
    for m in kernel_modules():
        doc = importlib.import_module(f"fedjax_pfl.kernels.{m}").__doc__ or ""
        lines.append(f"- [`{m}`](kernels/{m}.md): {doc.strip().splitlines()[0] if doc.strip() else ''}")
    return "\n".join(lines)


def kernel_page(module: str) -> str:
    return f"# kernels.{module}\n\n::: fedjax_pfl.kernels.{module}\n"


def reproductions_index(tables: list[ReproductionTable]) -> str:
    lines = ["# Reproductions", "",
             "`python -m fedjax_pfl.reproduce NAME` runs every cell of a paper's table (configs/tables/NAME.yaml) "
             "and writes `reproductions/NAME/table.md`, beside the paper's numbers where the table file has them. "
             "The committed tables:", ""]
    if not tables:
        lines.append("No reproduction yet: nothing is committed under `reproductions/`.")
    lines += [f"- [{t.title}]({t.folder}.md)" for t in tables]
    return "\n".join(lines) + "\n"


def benchmark_results() -> str:
    text = BENCHMARK_RESULTS.read_text(encoding="utf-8")
    return text + "\n\n---\n\nThis page is `benchmarks/RESULTS.md` as committed; how to run: [benchmarks](index.md).\n"


def generated_pages() -> dict[str, str]:
    """Every generated page: path under docs/ -> Markdown."""
    registry = methods()
    tables = reproduction_tables()
    aliases = row_methods(registry)
    pages = {"methods/index.md": methods_index(registry)}
    for name, algorithm in registry.items():
        pages[f"methods/{name}.md"] = method_page(name, algorithm, tables, registry, aliases)
    pages["reference/cli.md"] = cli_page()
    pages["reference/config.md"] = config_page()
    for module in kernel_modules():
        pages[f"reference/kernels/{module}.md"] = kernel_page(module)
    pages["reproductions/index.md"] = reproductions_index(tables)
    for t in tables:
        pages[t.page] = t.text
    pages["benchmarks/results.md"] = benchmark_results()
    return pages


def generated_nav() -> dict[str, list]:
    """Navigation entries of the generated pages, by the nav section they go in."""
    registry = methods()
    return {
        "Methods": [{a.paper.name: f"methods/{n}.md"} for n, a in registry.items()],
        "Kernels": [{m: f"reference/kernels/{m}.md"} for m in kernel_modules()],
        "Reproductions": [{t.title: t.page} for t in reproduction_tables()],
    }


# ---- MkDocs events -----------------------------------------------------------------

_PAGES: dict[str, str] = {}


def _extend(nav: list, section: str, entries: list) -> bool:
    """Append ``entries`` to the nav list titled ``section`` (searched at any depth)."""
    for item in nav:
        if isinstance(item, dict):
            for title, value in item.items():
                if title == section and isinstance(value, list):
                    value.extend(entries)
                    return True
                if isinstance(value, list) and _extend(value, section, entries):
                    return True
    return False


def on_config(config):
    _PAGES.clear()
    _PAGES.update(generated_pages())
    for section, entries in generated_nav().items():
        if not _extend(config["nav"], section, entries):
            raise KeyError(f"mkdocs.yml's nav has no section {section!r} for the generated pages")
    return config


def on_page_markdown(markdown, page, config, files):
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def pygments_css() -> str:
    """The code highlighting's colours (pymdownx.highlight writes Pygments' classes)."""
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style="default").get_style_defs(".highlight") + "\n"


def search_script(index_json: str) -> str:
    """The search index as a script that sets `SEARCH_SCRIPT_VARIABLE` (loadable from the file system)."""
    return f"window.{SEARCH_SCRIPT_VARIABLE} = {json.dumps(json.loads(index_json))};\n"


def on_files(files, config):
    from mkdocs.structure.files import File

    for path, text in _PAGES.items():
        files.append(File.generated(config, path, content=text))
    files.append(File.generated(config, "stylesheets/pygments.css", content=pygments_css()))
    return files


def on_post_build(config):
    index = Path(config["site_dir"]) / "search" / "search_index.json"
    index.with_suffix(".js").write_text(search_script(index.read_text(encoding="utf-8")), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["readme"]:
        raise SystemExit("usage: python docs/hooks.py readme   (rewrites README.md's methods table)")
    README.write_text(readme_with_methods_table(README.read_text(encoding="utf-8"), methods()), encoding="utf-8")
