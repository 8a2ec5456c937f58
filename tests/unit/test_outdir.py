"""A tool's --out (stack.tools.outdir): refused when not empty unless --overwrite, written beside
and renamed, so an interrupted write leaves nothing under the final name."""

import pytest

from stack.errors import ConfigError
from stack.tools.outdir import fresh_dir


def test_a_new_out_appears_only_when_the_write_is_complete(tmp_path):
    out = tmp_path / "export"
    with fresh_dir(str(out)) as tmp:
        (tmp_path / "probe").write_text(str(out.exists()))
        with open(f"{tmp}/model.bin", "w") as f:
            f.write("w")
    assert (tmp_path / "probe").read_text() == "False" and (out / "model.bin").read_text() == "w"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "probe"]


def test_an_interrupted_write_leaves_no_directory_and_an_old_one_untouched(tmp_path):
    out = tmp_path / "export"
    with pytest.raises(KeyboardInterrupt), fresh_dir(str(out)) as tmp:
        open(f"{tmp}/half.bin", "w").close()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    out.mkdir()
    (out / "old.bin").write_text("old")
    with pytest.raises(OSError), fresh_dir(str(out), overwrite=True):
        raise OSError("No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["export"] and (out / "old.bin").read_text() == "old"


def test_a_non_empty_out_is_refused_unless_overwrite_which_replaces_it_whole(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "old.bin").write_text("old")
    with pytest.raises(ConfigError, match="already exists and is not empty; .* --overwrite .*nothing was written"):
        with fresh_dir(str(out)):
            pass
    with fresh_dir(str(out), overwrite=True) as tmp:
        open(f"{tmp}/new.bin", "w").close()
    assert sorted(p.name for p in out.iterdir()) == ["new.bin"] and [p.name for p in tmp_path.iterdir()] == ["export"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"), fresh_dir(str(tmp_path / "file"), overwrite=True):
        pass
