"""The docs site builds with every link resolving (mkdocs --strict), and the README's links exist."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_site_builds_with_no_broken_link(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0 and "WARNING" not in proc.stderr, proc.stderr[-3000:]  # (-q would hide them)
    assert (tmp_path / "site" / "guides" / "multi-agent" / "index.html").exists()
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "reward_fns" in api  # the API page is made from the docstrings


def test_the_readme_is_short_and_its_links_exist():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(readme.splitlines()) <= 250
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", readme) if not link.startswith("http")]
    assert links and all(os.path.exists(os.path.join(ROOT, link)) for link in links), \
        [link for link in links if not os.path.exists(os.path.join(ROOT, link))]


def test_user_docs_carry_no_working_notes():
    """Measurement history is dated, never "stop N" or a commit id; targets are not "missed"."""
    pages = [os.path.join(ROOT, "README.md")] + [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
                                                 for f in fs if f.endswith(".md")]
    for page in pages:
        text = open(page, encoding="utf-8").read()
        assert not re.search(r"\b[Ss]top \d+\b|the issue's|\bre-run at [0-9a-f]{7}", text), page


def test_cross_references_name_sections_and_files_that_exist():
    """README "Section" names a README heading, and every repository path a page names in backticks
    or plain text (tools/x.sh, docs/x.md, configs/x.py, ...) exists."""
    pages = [os.path.join(ROOT, "README.md")] + [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(ROOT, "docs"))
                                                 for f in fs if f.endswith(".md")]
    headings = set(re.findall(r"^#+ (.+)$", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(), re.M))
    path = re.compile(r"(?<![\w/.=-])((?:tools|docs|configs|atgrpo_jax|envs|tpu_scripts|tests)/[\w/.-]*\w\."
                      r"(?:py|sh|md|jsonl|json))(?![\w])")  # (a command's --out=PATH is not there yet)
    bad = []
    for page in pages:
        text = open(page, encoding="utf-8").read()
        bad += [f"{page}: README \"{name}\"" for name in re.findall(r'README "([^"]+)"', text) if name not in headings]
        bad += [f"{page}: {p}" for p in path.findall(text) if not os.path.exists(os.path.join(ROOT, p))]
    assert not bad, bad
