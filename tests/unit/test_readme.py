"""README.md stays true: it shows the two commands and embeds the configuration reference rendered from the schema."""

from pathlib import Path

from asyncrl.config.reference import config_reference

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_shows_the_two_commands():
    assert "make run" in README and "make test" in README


def test_readme_config_reference_is_current():
    assert config_reference() in README, (
        "README.md's configuration reference is stale: regenerate it with "
        "`.venv/bin/python -c 'from asyncrl.config.reference import config_reference; print(config_reference())'`"
    )
