"""The values a run sends and reads: fingerprints, durations, timestamps."""

import datetime
import hashlib


def fingerprint(number):
    """The 32-byte fingerprint of request variant `number`."""
    return hashlib.sha256(("model-request-%s" % number).encode()).digest()


def seconds(value):
    """A timedelta of `value` seconds."""
    return datetime.timedelta(seconds=value)


def epoch(value):
    """A server timestamp as epoch seconds (None stays None)."""
    return None if value is None else value.timestamp()
