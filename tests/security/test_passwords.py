"""Tests for treefed.security.passwords: scrypt hashes in a self-describing string."""

from __future__ import annotations

import pytest

from treefed.security.passwords import (DEFAULT_N, hash_password, parse_password_hash,
                                        verify_password)

FAST = {"n": 2 ** 6, "r": 8, "p": 1}   # test speed; production uses the defaults


class TestHashPassword:
    def test_format_names_algorithm_and_parameters(self):
        """The stored string is scrypt$n$r$p$salt$hash with the parameters used."""
        stored = hash_password("s3cret", **FAST)
        parts = stored.split("$")
        assert parts[:4] == ["scrypt", "64", "8", "1"] and len(parts) == 6
        assert "s3cret" not in stored

    def test_random_salt_gives_different_hashes(self):
        """Two hashes of one password differ (fresh salt), both verify."""
        a, b = hash_password("pw", **FAST), hash_password("pw", **FAST)
        assert a != b and verify_password("pw", a) and verify_password("pw", b)

    def test_given_salt_is_reproducible(self):
        """The same salt and parameters give the same string."""
        salt = b"0123456789abcdef"
        assert hash_password("pw", salt=salt, **FAST) == hash_password("pw", salt=salt, **FAST)

    def test_defaults_are_slow_parameters(self):
        """Without arguments the production cost (n=2**14, r=8) is used."""
        assert parse_password_hash(hash_password("pw")).n == DEFAULT_N == 2 ** 14

    @pytest.mark.parametrize("params", [{"n": 1000}, {"n": 2 ** 21}, {"r": 0}, {"p": 17},
                                        {"n": 2 ** 20, "r": 8}])
    def test_out_of_bounds_parameters_are_refused(self, params):
        """n must be a power of two in range; r, p and memory are bounded."""
        with pytest.raises(ValueError):
            hash_password("pw", **{**FAST, **params})

    def test_short_salt_is_refused(self):
        """A salt shorter than 8 bytes is refused."""
        with pytest.raises(ValueError):
            hash_password("pw", salt=b"abc", **FAST)


class TestVerifyPassword:
    def test_right_and_wrong_password(self):
        """The right password verifies; a wrong one, a prefix or an empty one does not."""
        stored = hash_password("correct horse", **FAST)
        assert verify_password("correct horse", stored)
        for wrong in ("correct hors", "Correct horse", "", "correct horse "):
            assert not verify_password(wrong, stored)

    def test_unicode_password(self):
        """Passwords are UTF-8 encoded: non-ASCII ones work."""
        stored = hash_password("pässwörd-日本", **FAST)
        assert verify_password("pässwörd-日本", stored)
        assert not verify_password("passwort-日本", stored)

    @pytest.mark.parametrize("stored", [
        "", "plain", "bcrypt$1$2$3$abc$def",
        "scrypt$x$8$1$YWJjZGVmZ2g$YWJj",
        "scrypt$64$8$1$!!$YWJjZGVmZ2hpamtsbW5vcA",
        "scrypt$64$8$1$YWJj$YWJjZGVmZ2hpamtsbW5vcA",
        "scrypt$1073741824$8$1$YWJjZGVmZ2g$YWJjZGVmZ2hpamtsbW5vcA",
    ])
    def test_malformed_stored_value_is_false_not_an_exception(self, stored):
        """A malformed, foreign or too-costly stored value refuses the login quietly."""
        assert verify_password("pw", stored) is False

    def test_non_string_password_is_false(self):
        """A password that is not a str never verifies."""
        assert verify_password(None, hash_password("pw", **FAST)) is False  # type: ignore


class TestParsePasswordHash:
    def test_round_trip(self):
        """Parsing and printing a stored hash gives it back."""
        stored = hash_password("pw", **FAST)
        parsed = parse_password_hash(stored)
        assert str(parsed) == stored and (parsed.n, parsed.r, parsed.p) == (64, 8, 1)

    def test_error_never_quotes_the_hash(self):
        """Errors describe the problem without echoing the stored value."""
        with pytest.raises(ValueError) as info:
            parse_password_hash("scrypt$64$8$1$secretsalt!$secrethash!")
        assert "secret" not in str(info.value)
