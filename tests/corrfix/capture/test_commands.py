"""``corrfix capture info`` and ``pcapng`` on what they cannot read or write: one line, status 2."""

from __future__ import annotations

import argparse

import pyarrow as pa
import pytest

from corrfix.capture import CaptureWriter, add_capture_commands
from protocol import ApiKey
from protocol.testing import request_frame
from tests.support.capture_shell import Shell


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    add_capture_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    status = args.run(args)
    return status, capsys.readouterr().err


@pytest.fixture
def capture_with_a_foreign_file(tmp_path):
    """A capture, and next to it an Arrow stream some other tool wrote under the same suffix."""
    with CaptureWriter(tmp_path) as writer:
        shell = Shell(writer)
        shell.open()
        shell.client_sends(request_frame(ApiKey.METADATA, 1, 1))
    table = pa.table({"x": [1]})
    with pa.ipc.new_stream(str(tmp_path / "zz-other-tool.arrows"), table.schema) as stream:
        stream.write_table(table)
    return tmp_path


@pytest.mark.parametrize("command", ["info", "pcapng"])
def test_a_file_that_is_no_capture_is_reported_not_raised(
    capture_with_a_foreign_file, tmp_path, capsys, command
):
    out = ["-o", str(tmp_path / "out.pcapng")] if command == "pcapng" else []
    status, err = run(capsys, command, str(capture_with_a_foreign_file), *out)
    assert status == 2
    assert "zz-other-tool.arrows is not a corrfix capture" in err
    assert len(err.splitlines()) == 1


def test_a_pcapng_that_cannot_be_written_is_reported_not_raised(tmp_path, capsys):
    with CaptureWriter(tmp_path / "cap") as writer:
        Shell(writer).open()
    status, err = run(capsys, "pcapng", str(tmp_path / "cap"), "-o", str(tmp_path / "missing" / "out.pcapng"))
    assert status == 2
    assert "missing/out.pcapng" in err and len(err.splitlines()) == 1
