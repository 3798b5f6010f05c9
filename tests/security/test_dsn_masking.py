"""Passwords never shown: every connection string form libpq reads (URL with '@', ':' or '/' in the password,
percent-encoded, multi-host, the password query parameter, key=value quoted with spaces and escaped quotes),
alone or quoted in a message, for passwords of any characters; and the command line on an unreachable server."""

from __future__ import annotations

import itertools
import urllib.parse

import psycopg.conninfo
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pgjournal.cli.commands import app
from pgjournal.errors import ConfigurationError
from pgjournal.server.dsn import check_dsn, mask_dsn, redact

pytestmark = pytest.mark.mode_independent

# What a connection string can hold: any character but NUL (libpq's strings end there) and lone surrogates.
ANY = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
PASSWORDS = st.text(ANY, min_size=1, max_size=40)
WORDS = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc"), blacklist_characters="\x00"),
                min_size=1, max_size=40)
QUICK = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

FORMS = [
    # URL: an unencoded '@' (the password runs to the last '@'), ':', '/', '?', '#', a space
    ("postgresql://app:battery@horse@127.0.0.1:5432/db", "postgresql://app:***@127.0.0.1:5432/db"),
    ("postgresql://app:pa:ss/wo?rd#x@127.0.0.1/db", "postgresql://app:***@127.0.0.1/db"),
    ("postgres://app:two words@127.0.0.1/db", "postgres://app:***@127.0.0.1/db"),
    ("postgresql://app:p%40ss%3Aw%2Frd@127.0.0.1:5432/db?sslmode=disable",
     "postgresql://app:***@127.0.0.1:5432/db?sslmode=disable"),
    ("postgresql://app:s3cr3t@h1:5432,h2:5433,[::1]:5434/db?target_session_attrs=read-write",
     "postgresql://app:***@h1:5432,h2:5433,[::1]:5434/db?target_session_attrs=read-write"),
    ("postgresql://app:@127.0.0.1/db", "postgresql://app:@127.0.0.1/db"),
    ("postgresql://app@127.0.0.1:5432/db", "postgresql://app@127.0.0.1:5432/db"),
    ("postgresql://127.0.0.1:5432/db", "postgresql://127.0.0.1:5432/db"),
    ("postgresql://[::1]:5432/db", "postgresql://[::1]:5432/db"),
    # the password query parameter: only its value, whatever follows it stays
    ("postgresql://app@127.0.0.1/db?password=secret", "postgresql://app@127.0.0.1/db?password=***"),
    ("postgresql://app@127.0.0.1/db?password=se:cr%26et&sslmode=disable&application_name=x",
     "postgresql://app@127.0.0.1/db?password=***&sslmode=disable&application_name=x"),
    ("postgresql://app@127.0.0.1/db?sslmode=disable&password=secret:&connect_timeout=5",
     "postgresql://app@127.0.0.1/db?sslmode=disable&password=***&connect_timeout=5"),
    ("postgresql://app@127.0.0.1/db?sslpassword=keyphrase", "postgresql://app@127.0.0.1/db?sslpassword=***"),
    # key=value: quoted with spaces and escaped quotes and backslashes, unquoted with an escaped space
    ("host=127.0.0.1 password='it\\'s a s3cr3t \\\\ ok' dbname=db", "host=127.0.0.1 password=*** dbname=db"),
    ("host=127.0.0.1 password=two\\ words dbname=db", "host=127.0.0.1 password=*** dbname=db"),
    ("host=127.0.0.1 password = 's3cr3t' dbname=db", "host=127.0.0.1 password = *** dbname=db"),
    ("password=s3cr3t", "password=***"),
    ("host=127.0.0.1 password='unterminated secret", "host=127.0.0.1 password=***"),
    ("host=127.0.0.1 dbname=db", "host=127.0.0.1 dbname=db"),
]

MESSAGES = [
    # connection errors that echo the DSN: the punctuation after it stays
    ("cannot connect to postgresql://app:battery@horse@127.0.0.1:1/db: connection refused",
     "cannot connect to postgresql://app:***@127.0.0.1:1/db: connection refused"),
    ("cannot connect to postgresql://app@127.0.0.1/db?password=secret: connection refused",
     "cannot connect to postgresql://app@127.0.0.1/db?password=***: connection refused"),
    ("malformed DSN 'postgresql://app@127.0.0.1/db?password=secret': bad",
     "malformed DSN 'postgresql://app@127.0.0.1/db?password=***': bad"),
    ("malformed DSN 'postgresql://app:secret': bad", "malformed DSN 'postgresql://app:***': bad"),
    ("cannot connect to host=127.0.0.1 password='a \\' b' dbname=db: refused",
     "cannot connect to host=127.0.0.1 password=*** dbname=db: refused"),
    ("cannot connect to host=127.0.0.1 password=secret: refused",
     "cannot connect to host=127.0.0.1 password=***: refused"),
    ("connection to server at \"127.0.0.1\", port 1 failed: Connection refused",
     "connection to server at \"127.0.0.1\", port 1 failed: Connection refused"),
]


# A message that opens with the DSN: what follows the password (the ':' and the reason) stays, in every form,
# for passwords holding ':', '@', '/', '?' and '#' (percent-encoded where a URL query needs it).
OPENING = [
    ("postgresql://app@127.0.0.1/db?password=secret: connection refused",
     "postgresql://app@127.0.0.1/db?password=***: connection refused"),
    ("postgresql://app@127.0.0.1/db?password=se%3Acr%40et%2F%3F%23&sslmode=disable: connection refused",
     "postgresql://app@127.0.0.1/db?password=***&sslmode=disable: connection refused"),
    ("postgresql://app:se:cr@et/?#x@127.0.0.1:5432/db: connection refused",
     "postgresql://app:***@127.0.0.1:5432/db: connection refused"),
    ("host=127.0.0.1 password=se:cr@et/?# dbname=db: connection refused",
     "host=127.0.0.1 password=*** dbname=db: connection refused"),
    ("host=127.0.0.1 dbname=db password='se:cr @et/?#': connection refused",
     "host=127.0.0.1 dbname=db password=***: connection refused"),
    ("host=127.0.0.1 password=secret: connection refused", "host=127.0.0.1 password=***: connection refused"),
]


@pytest.mark.parametrize(("message", "masked"), OPENING)
def test_a_message_that_opens_with_the_dsn_keeps_what_follows(message: str, masked: str) -> None:
    assert mask_dsn(message) == masked
    assert mask_dsn(masked) == masked


@pytest.mark.parametrize(("dsn", "masked"), FORMS)
def test_every_form_libpq_reads(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked
    assert mask_dsn(masked) == masked  # masking twice (a message built from a masked DSN) changes nothing


@pytest.mark.parametrize(("message", "masked"), MESSAGES)
def test_messages_that_quote_a_dsn(message: str, masked: str) -> None:
    assert mask_dsn(message) == masked
    assert mask_dsn(masked) == masked


def url(password: str) -> str:
    return f"postgresql://app:{password}@127.0.0.1:5432,[::1]:5433/db?sslmode=disable"


@given(PASSWORDS)
@example("battery@horse")
@example(" /%")  # a space, then what reads as a path: once taken for a message quoting "postgresql://app"
@example("@/: ")  # an '@' and a space: once taken for a message quoting "postgresql://app:@/"
@example("a:b/c?d#e@f")
@example("x@y z@w")
@example("***:")
@example("\n\x1b\u202e")
@QUICK
def test_a_url_password_of_any_characters(password: str) -> None:
    """Unencoded (as a user types it) or percent-encoded (as libpq wants it)."""
    assert mask_dsn(url(password)) == url("***")
    assert mask_dsn(url(urllib.parse.quote(password, safe=""))) == url("***")


def test_every_url_password_of_up_to_four_characters_that_libpq_or_a_reader_may_take_for_structure() -> None:
    """Exhaustive where random examples are thin: every password of one to four of the characters that end or
    split a URL's parts, a space among them (the one property run that found ``' /%'`` found it by chance)."""
    shown = [password for n in range(1, 5) for password in map("".join, itertools.product(" /%?#:@a&='", repeat=n))
             for written in (password, urllib.parse.quote(password, safe="")) if mask_dsn(url(written)) != url("***")]
    assert not shown, shown[:10]


@given(PASSWORDS)
@example("se:cret")
@example("a&b")
@example("x' y")
@QUICK
def test_the_password_query_parameter_of_any_characters(password: str) -> None:
    encoded = urllib.parse.quote(password, safe="")
    for template in ("postgresql://app@127.0.0.1/db?password={}", "postgresql://app@127.0.0.1/db?password={}&sslmode=disable",
                     "postgresql://app@127.0.0.1/db?sslmode=disable&password={}&connect_timeout=5"):
        assert mask_dsn(template.format(encoded)) == template.format("***")


def key_value(password: str) -> str:
    return psycopg.conninfo.make_conninfo("", host="127.0.0.1", password=password, dbname="db", user="app")


@given(PASSWORDS)
@example("it's a secret")
@example("\\'")
@example("password=x")
@example("postgresql://a:b@c")
@QUICK
def test_a_key_value_password_of_any_characters(password: str) -> None:
    """Quoted by psycopg where it must be: spaces, quotes and backslashes escaped."""
    assert psycopg.conninfo.conninfo_to_dict(key_value(password))["password"] == password
    assert mask_dsn(key_value(password)) == key_value("***")


@given(WORDS)
@example("battery@horse")
@example("se:cret:")
@example("a'b")
@QUICK
def test_a_message_that_echoes_the_dsn(password: str) -> None:
    """A DSN libpq accepts, quoted in a message (the password of a URL has no unencoded space there)."""
    for dsn, masked in ((url(password), url("***")),
                        (url(urllib.parse.quote(password, safe="")), url("***")),
                        (key_value(password), key_value("***")),
                        (f"postgresql://app@127.0.0.1/db?password={urllib.parse.quote(password, safe='')}",
                         "postgresql://app@127.0.0.1/db?password=***")):
        assert mask_dsn(f"cannot connect to {dsn}: refused") == f"cannot connect to {masked}: refused"
        assert mask_dsn(f"malformed DSN '{dsn}': bad") == f"malformed DSN '{masked}': bad"


@given(PASSWORDS)
@example("two words")
@example("it's")
@example("p@ss word")
@QUICK
def test_redact_removes_the_password_wherever_a_message_quotes_it(password: str) -> None:
    """libpq's parse errors quote the password alone (``unexpected spaces found in "..."``)."""
    if len(password) < 3 or password in " ".join((url("***"), key_value("***"), "cannot use : unexpected spaces")):
        return  # too short to tell from the rest of the message, or part of what it says besides
    for dsn in (url(password), url(urllib.parse.quote(password, safe="")), key_value(password)):
        message = f'cannot use {dsn}: unexpected spaces found in "{password}"'
        assert password not in redact(message, dsn)
        assert password not in redact(dsn, dsn)


@pytest.mark.parametrize("dsn", [
    "postgresql://app:bat tery@horse@127.0.0.1/db",
    "host=127.0.0.1 password='bat tery horse",
    "postgresql://app:battery%zzhorse@127.0.0.1/db",
])
def test_a_dsn_libpq_cannot_parse_never_shows_its_password(dsn: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_dsn(dsn)
    for part in ("bat", "tery", "horse"):
        assert part not in str(caught.value)


@pytest.mark.parametrize("dsn", [
    "postgresql://app:battery@horse:staple/x@127.0.0.1:1/db",
    "postgresql://app:battery%40horse@127.0.0.1:1,127.0.0.1:2/db",
    "postgresql://app@127.0.0.1:1/db?password=batteryhorse&connect_timeout=5",
    "host=127.0.0.1 port=1 password='battery \\'horse\\' staple' dbname=db",
])
def test_the_command_line_on_an_unreachable_server(dsn: str) -> None:
    """The real connection error, through the command line: not a piece of the password."""
    result = CliRunner().invoke(app, ["persistence-ids", "--dsn", dsn], terminal_width=400)
    assert result.exit_code == 1, result.output
    assert "error: cannot connect to" in result.output
    for part in ("battery", "horse", "staple"):
        assert part not in result.output, result.output
