"""The run report (kvrepro.report): content from a small run folder, self-containment,
escaping, `reproduce` writing it, and the page in headless Chromium."""

from __future__ import annotations

import base64
import html.parser
import re
import subprocess
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from kvrepro import cli
from kvrepro._paths import data_file
from kvrepro.report import STUDY_FIGURES, latest_run_dir, png_data_uri, write_report
from kvrepro.studies import reference
from tests.browser import CHROMIUM, NO_CHROMIUM, headless_chromium, png_size
from tests.conftest import NOTEBOOKS

REPRODUCED = {"A7.dwpd_raid10": 3.3, "A1.cache_read": 90.0}
FIGURES = ("A7-drive-endurance.png", "kv-write-volume.png")
VALIDATION = pd.DataFrame({"run": ["fit", "fit", "a-seed-rate"], "tier": ["dram"] * 3,
                           "metric": ["ttft_median_s", "ttft_p90_s", "ttft_median_s"],
                           "live": [1.0, 2.0, 1.0], "sim": [1.05, 2.6, 0.5],
                           "null_sim": [2.0, 4.0, 2.0], "error": [5.0, 30.0, -50.0],
                           "error_unit": ["%"] * 3, "null_error": [100.0, 100.0, 100.0],
                           "informative": [True] * 3})


class _Tags(html.parser.HTMLParser):
    """Every start tag with its attributes, and the page's text (a reference that does not
    use the template)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(path: Path) -> _Tags:
    parser = _Tags()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def _png(path: Path, colour: str) -> Path:
    fig, ax = plt.subplots(figsize=(3, 2), dpi=50)
    ax.plot([0, 1, 2], [1, 0, 2], color=colour)
    fig.savefig(path)
    plt.close(fig)
    return path


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A tiny reproduce run folder: a headline table from `reference.compare`, a validation
    table, and two figures (one of study A7, one of the package's own) in tmp/figures."""
    run = tmp_path / "runs" / "20260101T000000Z"
    run.mkdir(parents=True)
    reference.compare(REPRODUCED, source="test_nb").to_csv(run / "headline_numbers.csv",
                                                          index=False)
    VALIDATION.to_csv(run / "validation.csv", index=False)
    figures = tmp_path / "figures"
    figures.mkdir()
    for name, colour in zip(FIGURES, ("tab:blue", "tab:red"), strict=True):
        _png(figures / name, colour)
    return run


def test_report_sections_figures_and_numbers(run_dir: Path) -> None:
    path = write_report(run_dir, run_dir.parents[1] / "figures")
    assert path == run_dir / "report.html"
    page = _parse(path)
    ids = {attrs.get("id") for _, attrs in page.tags}
    assert {f"fig-{fig}" for fig in STUDY_FIGURES} <= ids and {"own", "validation"} <= ids
    images = {attrs["alt"]: attrs["src"] for tag, attrs in page.tags if tag == "img"}
    assert set(images) == set(FIGURES)
    for name, src in images.items():  # the embedded bytes are the file's bytes
        assert src.startswith("data:image/png;base64,")
        raw = (run_dir.parents[1] / "figures" / name).read_bytes()
        assert base64.b64decode(src.split(",", 1)[1]) == raw
    text = " ".join(" ".join(page.text).split())
    ref = pd.read_csv(data_file("reference", "reference_numbers.csv")).set_index("id")
    study = float(ref.at["A7.dwpd_raid10", "value"])
    diff = (REPRODUCED["A7.dwpd_raid10"] - study) / study * 100
    assert "A7.dwpd_raid10 drive writes per day" in text
    assert f"{REPRODUCED['A7.dwpd_raid10']:g}" in text and f"{diff:+.1f} %" in text
    assert "+30.0 %" in text and "-50.0 %" in text  # the validation table's errors
    assert "No headline number of B5 in this run." in text


def test_a7_numbers_and_figure_share_one_section(run_dir: Path) -> None:
    source = write_report(run_dir, run_dir.parents[1] / "figures").read_text()
    a7 = re.search(r'id="fig-A7">(.*?)</section>', source, re.S).group(1)
    assert "A7.dwpd_raid10" in a7 and 'alt="A7-drive-endurance.png"' in a7
    assert "A1.cache_read" not in a7 and "kv-write-volume" not in a7


def test_report_is_self_contained_and_escaped(run_dir: Path) -> None:
    table = pd.read_csv(run_dir / "headline_numbers.csv")
    table.loc[0, "quantity"] = '<script>alert("x")</script>'
    table.to_csv(run_dir / "headline_numbers.csv", index=False)
    path = write_report(run_dir, run_dir.parents[1] / "figures", out=run_dir / "other.html")
    page = _parse(path)
    assert not [t for t, _ in page.tags if t in ("script", "link", "iframe")]
    links = [v for _, attrs in page.tags for k, v in attrs.items() if k in ("src", "href")]
    assert links and all(v.startswith(("data:", "#")) for v in links), links
    assert '<script>alert("x")</script>' in " ".join(page.text)  # shown as text


def test_latest_run_dir_and_errors(tmp_path: Path, run_dir: Path) -> None:
    runs = run_dir.parent
    (runs / "20990101T000000Z").mkdir()  # newer, but no headline table
    (runs / "fio-20990101T000000Z").mkdir()
    (runs / "fio-20990101T000000Z" / "headline_numbers.csv").write_text("id\n")
    assert latest_run_dir(runs) == run_dir
    with pytest.raises(FileNotFoundError, match="headline_numbers.csv"):
        write_report(runs / "20990101T000000Z", tmp_path)
    (tmp_path / "fake.png").write_bytes(b"GIF89a")
    with pytest.raises(ValueError, match="fake.png"):
        png_data_uri(tmp_path / "fake.png")


def test_reproduce_writes_report_with_timings(tmp_path: Path, capsys) -> None:
    small = ["-p", "token_rates_tok_s=[4200]", "-p", "prompt_tokens=[1024]", "-p",
             "max_ttl_s=600"]
    code = cli.main(["reproduce", "--only", "sizing", "--notebooks", str(NOTEBOOKS),
                     "--figures", str(tmp_path / "fig"),
                     "--runs", str(tmp_path / "runs"), *small])
    assert code == 0
    [printed] = re.findall(r"^Report: (.+)$", capsys.readouterr().out, re.M)
    report = Path(printed)
    [run] = (tmp_path / "runs").iterdir()
    assert report == run / "report.html" and report.is_file()
    timings = pd.read_csv(run / "timings.csv")
    assert list(timings.notebook) == ["01_sizing_endurance.ipynb"]
    assert timings.wall_s.iloc[0] > 0 and timings.status.iloc[0] == "ok"
    page = _parse(report)
    alts = {attrs["alt"] for tag, attrs in page.tags if tag == "img"}
    assert alts == {p.name for p in (tmp_path / "fig").glob("*.png")} and alts
    text = " ".join(page.text)
    assert "A7.dwpd_raid10" in text and "01_sizing_endurance.ipynb" in text
    assert "max_ttl_s" in text and "600" in text  # the injected parameter is listed


_IMAGES_DECODED = """Array.from(document.images).map(i => ({alt: i.alt,
    ok: i.complete && i.naturalWidth > 0 && i.naturalHeight > 0}))"""


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_report_in_headless_chromium(run_dir: Path) -> None:
    """The page loads with no console error and no network request, every figure decodes,
    and a screenshot is taken; a broken copy (a corrupt image, a throwing script) shows
    that both checks can fail."""
    path = write_report(run_dir, run_dir.parents[1] / "figures")
    broken = run_dir / "broken.html"
    source = path.read_text()
    broken.write_text(source.replace("base64,iVBOR", "base64,AAAA", 1)
                      .replace("</body>", "<script>throw new Error('on purpose')</script></body>"))
    with headless_chromium(run_dir) as page:
        page.navigate(path.as_uri())
        decoded = page.evaluate(_IMAGES_DECODED)
        errors = page.console_errors()
        remote = [u for u in page.requested_urls() if not u.startswith(("data:", "file:"))]
        viewport = page.evaluate("[innerWidth * devicePixelRatio, innerHeight * devicePixelRatio]")
        shot = page.screenshot(run_dir / "report.png")
        page.navigate(broken.as_uri())
        broken_decoded = page.evaluate(_IMAGES_DECODED)
        broken_errors = page.console_errors()[len(errors):]
    assert sorted(d["alt"] for d in decoded) == sorted(FIGURES)
    assert all(d["ok"] for d in decoded), decoded
    assert errors == [] and remote == []
    assert sum(not d["ok"] for d in broken_decoded) == 1
    assert any("on purpose" in e for e in broken_errors), broken_errors
    data = shot.read_bytes()
    assert png_size(data) == tuple(viewport) and viewport[0] == 1280 and len(data) > 10_000


def test_report_shows_the_fitted_residuals_and_the_explained_misses(run_dir: Path) -> None:
    from kvrepro.studies.study_a_misses import save_misses

    misses = pd.DataFrame([{"id": "A4.ttft_cached", "study": 0.5, "reproduced": 0.06,
                            "why": "no queue & no load <while VRAM holds>", "evidence": 0.0}])
    save_misses(misses, run_dir / "results", "04_sim_study_a")
    page = _parse(write_report(run_dir, run_dir.parents[1] / "figures"))
    text = " ".join(" ".join(page.text).split())
    assert "fit" in {attrs.get("id") for _, attrs in page.tags}
    for ref_id in ("A2.baseline_plateau", "A5.resumes", "B6.opt_high"):  # every plan target
        assert ref_id in text
    assert "no queue & no load <while VRAM holds>" in text  # escaped, shown as text
    assert "04_sim_study_a" in text


def test_a_figure_measured_here_is_shown_as_such_and_kept_out_of_the_tracked_ones(
        run_dir: Path) -> None:
    """fio figures change with every run: they go to figures/this-machine/ (ignored by git,
    so a fresh clone's `make reproduce` reports a clean commit) and the report says where
    they come from."""
    from kvrepro.plots import MEASURED_HERE, save_figure

    figures = run_dir.parents[1] / "figures"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    paths = save_figure(fig, figures, "B5-ssd-parallelism", measured_here=True)
    assert {p.parent.name for p in paths} == {MEASURED_HERE}
    source = write_report(run_dir, figures).read_text()
    b5 = re.search(r'id="fig-B5">(.*?)</section>', source, re.S).group(1)
    assert 'alt="B5-ssd-parallelism.png"' in b5 and "measured on this machine" in b5
    a7 = re.search(r'id="fig-A7">(.*?)</section>', source, re.S).group(1)
    assert "measured on this machine" not in a7
    ignored = subprocess.run(["git", "check-ignore", "-q", f"figures/{MEASURED_HERE}/x.png"],
                             cwd=NOTEBOOKS.parent)
    assert ignored.returncode == 0
