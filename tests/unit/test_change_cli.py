"""`plan --base/--base-file` and `--format` on the command line, on the
recorded ConnectX-7 host (fake kernel, tests/fakes.py, as tests/unit/test_cli.py)."""

from __future__ import annotations

import json
import subprocess

from markdown_it import MarkdownIt

from .test_cli import fake, invoke, run_fake  # noqa: F401 - fake is a fixture

OLD = "nictune: 1\ninterfaces:\n  rails:\n    match: {driver: mlx5_core}\n    mtu: 9000\n"
NEW = OLD.replace("9000", "8000")


def write(tmp_path, name, text) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_base_file_shows_the_change_apart_from_drift(fake, tmp_path):  # noqa: F811
    new, old = write(tmp_path, "new.yaml", NEW), write(tmp_path, "old.yaml", OLD)
    result = run_fake(fake, "plan", new, "--base-file", old, "--format", "json")
    report = json.loads(result.stdout)
    assert result.exit_code == 2 and fake.kernel.writes == []
    (group,) = report["change"]["effect"]
    assert group["hosts"] == ["fake:cx7-host"]
    assert {(r["key"]["target"], r["old"]["value"], r["new"]["value"]) for r in group["rows"]} == {
        ("enp23s0f0np0", 9000, 8000), ("enp23s0f1np1", 9000, 8000)}
    (drift,) = report["change"]["drift"]
    assert {r["current"] for r in drift["rows"]} == {1500}

    text = run_fake(fake, "plan", new, "--base-file", old).stdout
    assert "effect on 1 host(s)" in text and "drift already on 1 host(s)" in text

    md = run_fake(fake, "plan", new, "--base-file", old, "--format", "markdown").stdout
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    assert sum(t.type == "table_open" for t in tokens) == 2  # the effect, the drift
    assert md.startswith("### nictune plan")


def test_plain_plan_as_markdown(fake, tmp_path):  # noqa: F811
    new = write(tmp_path, "new.yaml", NEW)
    md = run_fake(fake, "plan", new, "--format", "markdown").stdout
    assert md.startswith("### nictune plan") and "| `enp23s0f0np0` | `link mtu` | `1500` | `8000` |" in md


def test_bad_base_options_are_one_line_errors(fake, tmp_path):  # noqa: F811
    new, old = write(tmp_path, "new.yaml", NEW), write(tmp_path, "old.yaml", OLD)
    both = run_fake(fake, "plan", new, "--base", "HEAD", "--base-file", old, "--json")
    assert both.exit_code == 1 and "do not go together" in json.loads(both.stdout)["error"]["message"]
    no_git = run_fake(fake, "plan", new, "--base", "HEAD", "--json")
    assert no_git.exit_code == 1
    assert "--base-file" in json.loads(no_git.stdout)["error"]["message"]


def test_base_ref_from_git_and_lint_on_change(fake, tmp_path):  # noqa: F811
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    path = write(tmp_path, "p.yaml", OLD)
    git("add", "p.yaml")
    git("commit", "-qm", "one")
    write(tmp_path, "p.yaml", OLD.replace("9000", "1200"))  # below IPv6's minimum: a lint warning
    report = json.loads(run_fake(fake, "plan", path, "--base", "HEAD", "--json").stdout)
    lint = report["change"]["lint"]
    assert [f["code"] for f in lint["introduced"]] and lint["fixed"] == []
    assert report["change"]["effect"][0]["rows"][0]["old"]["source"] == "HEAD:p.yaml:5"


def test_base_ref_says_which_links_lead_out_of_the_repository(fake, tmp_path):  # noqa: F811
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (tmp_path / "d").mkdir()
    write(tmp_path, "d/keep", "")
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "b").symlink_to("../d")
    (tmp_path / "old.yaml").symlink_to("a/b/../../elsewhere.yaml")  # root/d/../.. is outside
    path = write(tmp_path, "p.yaml", OLD)
    git("add", "-A")
    git("commit", "-qm", "one")
    result = run_fake(fake, "plan", path, "--base", "HEAD", "--json")
    assert json.loads(result.stdout)["change"]["effect"] == []
    assert ("warning: --base HEAD: 1 symbolic link(s) lead outside the repository and are left "
            "out of the base: old.yaml -> a/b/../../elsewhere.yaml") in result.stderr
    # The work tree's old.yaml is now a profile; at HEAD it is that link.
    (tmp_path / "old.yaml").unlink()
    write(tmp_path, "old.yaml", NEW)
    through = run_fake(fake, "plan", str(tmp_path / "old.yaml"), "--base", "HEAD", "--json")
    assert through.exit_code != 0
    assert "old.yaml at HEAD is reached through the symbolic link old.yaml -> " \
           "a/b/../../elsewhere.yaml, which leads outside the repository" in through.output
