"""`gguf-chat pull`, `list` and `rm` as a person runs them, against the local fake Hub; the download bar."""
import io
import os
import subprocess
import sys

from app.cli import main
from app.progress import DownloadBar
from tests.hub_server import TOKEN, hub as fake_hub  # noqa: F401 (a fixture)


def test_pull_prints_where_it_landed_and_progress_on_stderr(fake_hub, capsys):
    assert main(["pull", "tester/split-GGUF"]) == 0
    out, err = capsys.readouterr()
    paths = out.split()
    assert [os.path.basename(p) for p in paths] == [f"Big-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(os.path.isfile(p) for p in paths)
    assert "pulling Big-Q4_K_M-00001-of-00003.gguf (160 kB)" in err  # stderr is no tty here: plain lines
    assert "tester/split-GGUF:Q4_K_M (481 kB, 3 parts)" in err
    assert TOKEN not in out + err


def test_pull_file_flag(fake_hub, capsys):
    assert main(["pull", "tester/tiny-GGUF", "--file", "tiny-UD-Q4_K_XL.gguf"]) == 0
    assert capsys.readouterr().out.strip().endswith("/tiny-UD-Q4_K_XL.gguf")
    assert main(["pull", "tester/tiny-GGUF:Q8_0", "--file", "tiny-Q8_0.gguf"]) == 1
    assert capsys.readouterr().err == "gguf-chat: error: give a quant tag or --file, not both\n"


def test_errors_are_one_line(fake_hub, capsys):
    for ref in ["tester/missing", "tester/tiny-GGUF:Q2_K", "tester/nogguf", "not-a-ref"]:
        assert main(["pull", ref]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("gguf-chat: error: ") and err.count("\n") == 1 and TOKEN not in err


def test_list_and_rm(fake_hub, capsys):
    main(["pull", "tester/tiny-GGUF:Q8_0"])
    main(["pull", "tester/tiny-GGUF:Q4_K_M"])
    capsys.readouterr()
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "QUANT", "SIZE", "PATH"]
    assert [line.split()[:4] for line in lines[1:]] == [["tester/tiny-GGUF:Q4_K_M", "Q4_K_M", "160", "kB"],
                                                       ["tester/tiny-GGUF:Q8_0", "Q8_0", "240", "kB"]]
    assert main(["rm", "tester/tiny-GGUF:Q8_0"]) == 0
    assert capsys.readouterr().out == "removed tester/tiny-GGUF:Q8_0 (240 kB)\n"
    assert main(["rm", "tester/tiny-GGUF:Q8_0"]) == 1
    assert "no pulled model named tester/tiny-GGUF:Q8_0; see gguf-chat list" in capsys.readouterr().err
    assert main(["rm", "tester/tiny-GGUF"]) == 0  # the only one left: the repo name is enough
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    assert out == "removed tester/tiny-GGUF:Q4_K_M (160 kB)\n" and err.startswith("no models in ")


def test_environment_conventions_in_a_fresh_process(fake_hub, tmp_path):
    """HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE as a user sets them."""
    env = dict(os.environ, HF_ENDPOINT=fake_hub.endpoint, HF_HUB_CACHE=str(tmp_path / "cache"), HF_TOKEN=TOKEN,
               HF_HOME=str(tmp_path / "home"))

    def cli(*args, **extra):
        return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True,
                              env=dict(env, **extra))

    pulled = cli("pull", "tester/tiny-GGUF:Q4_K_M")
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.startswith(str(tmp_path / "cache" / "models--tester--tiny-GGUF" / "snapshots"))
    n = len(fake_hub.requests)
    offline = cli("pull", "tester/tiny-GGUF:q4_k_m", HF_HUB_OFFLINE="1")
    assert offline.returncode == 0 and offline.stdout == pulled.stdout
    missing = cli("pull", "tester/tiny-GGUF:Q8_0", HF_HUB_OFFLINE="1")
    assert missing.returncode == 1 and "HF_HUB_OFFLINE is set and tester/tiny-GGUF:Q8_0 is not in the cache" \
        in missing.stderr
    listed = cli("list", HF_HUB_OFFLINE="1")
    assert listed.stdout.splitlines()[1].startswith("tester/tiny-GGUF:Q4_K_M")
    assert len(fake_hub.requests) == n
    assert all(TOKEN not in r.stdout + r.stderr for r in (pulled, offline, missing, listed))


def test_bar_on_a_terminal():
    now = [0.0]
    out = io.StringIO()
    bar = DownloadBar(out, tty=True, clock=lambda: now[0])
    bar("model.gguf", 0, 1_700_000_000)
    now[0] = 127.4
    bar("model.gguf", 586_000_000, 1_700_000_000)
    line = out.getvalue().split("\r")[-1]
    assert line == "model.gguf   34% ▕████████                 ▏ 586 MB/1.7 GB  4.6 MB/s  4m2s\x1b[K"
    now[0] = 400.0
    bar("model.gguf", 1_700_000_000, 1_700_000_000)
    assert out.getvalue().endswith("100% ▕█████████████████████████▏ 1.7 GB/1.7 GB  4.2 MB/s\x1b[K\n")


def test_bar_in_a_log_counts_speed_from_where_it_resumed():
    now = [10.0]
    out = io.StringIO()
    bar = DownloadBar(out, tty=False, clock=lambda: now[0])
    bar("m.gguf", 1_000_000_000, 1_700_000_000)
    bar("m.gguf", 1_200_000_000, 1_700_000_000)
    now[0] = 20.0
    bar("m.gguf", 1_700_000_000, 1_700_000_000)
    assert out.getvalue() == ("pulling m.gguf (1.7 GB, resuming at 1.0 GB)\n"
                              "pulled m.gguf (1.7 GB in 10.0s, 70.0 MB/s)\n")


def test_info_takes_a_hub_reference_and_a_pulled_name(fake_hub, capsys):
    assert main(["info", "tester/tiny-GGUF:Q8_0", "--json"]) == 0  # pulled first, progress on stderr
    out, err = capsys.readouterr()
    assert '"architecture"' in out and "pulling tiny-Q8_0.gguf" in err
    assert main(["info", "tester/tiny-GGUF:Q8_0"]) == 0  # now cached: no download
    out, err = capsys.readouterr()
    assert "architecture" in out and "pulling" not in err
