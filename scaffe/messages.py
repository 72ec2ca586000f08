"""What the readers and the rewriters of Caffe's protobuf messages share (scaffe.io reads files, scaffe.upgrade
rewrites old formats, scaffe.data decodes database records): the error a bad file raises, a message's copy,
and a Datum from its stored bytes. scaffe.io and scaffe.data export them too, as parts of their APIs."""
from google.protobuf.message import DecodeError

from scaffe.proto import caffe_pb2


class CaffeFormatError(ValueError):
    """A file could not be read as the Caffe format it should have; the message names the file."""


def copy_message(msg):
    """A new protobuf message equal to `msg`."""
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def parse_datum(value):
    """A Datum from the bytes stored in the database (or the Datum itself). Bytes that are no Datum raise
    CaffeFormatError; the caller names the database and the record."""
    if isinstance(value, caffe_pb2.Datum):
        return value
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(bytes(value))
    except DecodeError as e:
        raise CaffeFormatError(f"not a Caffe Datum ({' '.join(str(e).split())})") from None
    return datum
