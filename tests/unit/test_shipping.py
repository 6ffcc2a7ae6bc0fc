"""fabric/shipping.py: a notebook's folder packed (bounded) and unpacked on the slice."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramfabric.shipping import FolderTooLarge, pack_folder, unpacked


def test_the_folder_ships_but_not_hidden_files_caches_or_the_copy_being_written(
    tmp_path: Path,
) -> None:
    # Given a notebook's folder with data, a sub-folder, hidden and cached files, a link
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "nb.ipynb").write_text("{}")
    (tmp_path / "data.csv").write_text("1,2\n")
    (tmp_path / "sub" / "more.txt").write_text("more")
    (tmp_path / ".git" / "HEAD").write_text("ref")
    (tmp_path / "__pycache__" / "m.pyc").write_bytes(b"x")
    (tmp_path / "nb.out.ipynb").write_text("old copy")
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.csv"
    outside.write_text("linked")
    (tmp_path / "linked.csv").symlink_to(outside)
    # When it is packed, leaving out the copy, and unpacked
    archive = pack_folder(tmp_path, leave_out=[tmp_path / "nb.out.ipynb"])
    with unpacked(archive) as folder:
        got = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}
    # Then the notebook, its data and sub-folder came, the linked file as a file
    assert got == {
        "nb.ipynb": "{}",
        "data.csv": "1,2\n",
        "sub/more.txt": "more",
        "linked.csv": "linked",
    }
    # And the unpacked folder is gone afterwards
    assert not folder.exists()


def test_a_folder_over_the_limit_is_refused_naming_its_largest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vramfabric.shipping.MAX_FOLDER_BYTES", 1000)
    (tmp_path / "big.bin").write_bytes(bytes(2000))
    (tmp_path / "nb.ipynb").write_text("{}")
    with pytest.raises(FolderTooLarge, match=r"at most 0 MiB \(largest: big.bin"):
        pack_folder(tmp_path)
