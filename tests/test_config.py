"""The project config file: `[tool.rt4chart]` in pyproject.toml or rt4chart.toml, found from the working
directory upward; its settings are the defaults of the flags they name (a flag overrides), `rt4 config`
says where each value came from, and a bad file, key or value is a usage error naming the file and key.
The real CLI in a subprocess at 80 columns, the scripted judge of the examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES

import rt4chart
from rt4chart.runs.config import load_config
from rt4chart.runs.config_file import ConfigError

RULES = EXAMPLES / "answers.rules.json"


def rt4(cwd: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "80"}, timeout=300, check=False)


def settings_of(result: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    return {row["key"]: row for row in json.loads(result.stdout)["settings"]}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project whose pyproject.toml sets a judge, a policy, an output, a method option and no cache;
    the runs start in a subdirectory of it."""
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "rag"\n\n[tool.rt4chart]\n'
        f'judge = "scripted:{RULES}"\nfail-on = "contradicted"\njunit = "reports/junit.xml"\n'
        "window = 12\nno_cache = true\n", encoding="utf-8")
    (tmp_path / "reports").mkdir()
    (tmp_path / "app" / "tests").mkdir(parents=True)
    return tmp_path


def test_a_run_in_a_subdirectory_takes_the_projects_defaults(project: Path) -> None:
    here = project / "app" / "tests"
    result = rt4(here, "verify", EXAMPLES / "answers.jsonl", "--out", "audit.jsonl", "-q")
    records = [json.loads(line) for line in (here / "audit.jsonl").read_text(encoding="utf-8").splitlines()]
    assert records and all(record["judge"].startswith("scripted:answers.rules.json#") for record in records)
    manifest = json.loads((here / "audit.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert manifest["options"]["window"] == 12
    # the junit path is read from the config file's directory, not from where the run started
    cases = list(ElementTree.parse(project / "reports" / "junit.xml").iter("testcase"))
    assert len(cases) == len(records)
    contradicted = any(record["label"] == "contradicted" for record in records)
    assert result.returncode == (1 if contradicted else 0), result.stderr


def test_rt4_config_says_where_each_setting_came_from_and_flags_override(project: Path) -> None:
    settings = settings_of(rt4(project / "app", "config", "--json", "--window", "30"))
    config = str(project / "pyproject.toml")
    assert settings["judge"] == {"key": "judge", "value": f"scripted:{RULES}", "source": config}
    assert settings["junit"]["value"] == str(project / "reports" / "junit.xml")
    assert settings["window"] == {"key": "window", "value": 30, "source": "flag"}
    assert settings["overlap"]["source"] == "default" and settings["no-cache"]["value"] is True
    text = rt4(project, "config")
    assert text.returncode == 0 and f"# config file: {config}" in text.stdout
    assert 'fail-on = "contradicted"  # ' + config in text.stdout


def test_rt4chart_toml_comes_before_pyproject_and_the_search_stops_at_the_first(project: Path) -> None:
    (project / "app" / "rt4chart.toml").write_text("budget = 0.25\n", encoding="utf-8")
    settings = settings_of(rt4(project / "app" / "tests", "config", "--json"))
    own = str(project / "app" / "rt4chart.toml")
    assert settings["budget"]["value"] == 0.25 and settings["budget"]["source"] == own
    assert settings["judge"]["source"] == "default", "the nearest file alone applies"


@pytest.mark.parametrize(
    ("table", "message"),
    [("budgte = 1\n", "unknown key 'budgte'"),
     ("budget = -1\n", "budget: Input should be greater than or equal to 0"),
     ('fail-on = "sometimes"\n', "fail-on: "),
     ('window = "wide"\n', "window: "),
     ("window = \n", "cannot read it as TOML")],
)
def test_a_bad_key_or_value_is_a_usage_error_naming_the_file_and_key(
    tmp_path: Path, table: str, message: str
) -> None:
    (tmp_path / "rt4chart.toml").write_text(table, encoding="utf-8")
    result = rt4(tmp_path, "verify", EXAMPLES / "answers.jsonl")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{tmp_path / 'rt4chart.toml'}: " in result.stderr and message in result.stderr
    with pytest.raises(ConfigError, match=message.split(":")[0]):
        load_config(tmp_path)


def test_the_library_loads_the_same_settings_as_a_run_spec(
    project: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    config = rt4chart.load_config(project / "app")
    assert config.path == project / "pyproject.toml"
    spec = config.run_spec()
    assert spec.judge == f"scripted:{RULES}" and spec.options.window == 12 and spec.cache is None
    assert spec.outputs.junit == project / "reports" / "junit.xml"
    elsewhere = tmp_path_factory.mktemp("no-config")
    assert rt4chart.load_config(elsewhere) == rt4chart.ProjectConfig(), "no file: no setting"
