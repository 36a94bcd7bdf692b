"""The whole path: two real `gnomon bench --quick` files from different commits are ingested,
compared and turned into a site, all through the CLI."""

import json

from gnomon import cli

BASE, HEAD = "a" * 40, "b" * 40


def test_bench_ingest_compare_site(tmp_path, capsys):
    files = []
    for commit in (BASE, HEAD):
        out = tmp_path / f"{commit[:4]}.json"
        assert cli.main(["bench", "--quick", "--suite", "norm", "--runs", "3",
                         "--commit", commit, "--out", str(out)]) == 0
        files.append(str(out))
    db = f"sqlite:///{tmp_path / 'bench.sqlite'}"
    assert cli.main(["dash", "ingest", "--db", db, *files]) == 0
    assert cli.main(["dash", "ingest", "--db", db, *files]) == 0  # idempotent
    capsys.readouterr()

    markdown = tmp_path / "compare.md"
    code = cli.main(["dash", "compare", "--db", db, BASE[:8], HEAD[:8],
                     "--markdown", str(markdown)])
    # the same build twice: 1 only if this machine's noise looks like a regression, 3 where a
    # key's run-to-run noise hides a change beyond the threshold (AMBIGUOUS is not a pass)
    assert code in (0, 1, 3)
    table = markdown.read_text()
    keys = {case["key"] for run in json.loads(open(files[0]).read())["runs"]
            for case in run["cases"]}
    for key in keys:
        assert key in table or key.replace("|", "\\|") in table

    site = tmp_path / "site"
    assert cli.main(["dash", "site", "--db", db, str(site)]) == 0
    index = (site / "index.html").read_text()
    assert all(key.split("[")[0] in index for key in keys)
    for page in ("sweep.html", "roofline.html", "compare.html", "machines.html"):
        assert (site / page).stat().st_size > 0
