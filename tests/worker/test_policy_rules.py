"""worker/tools/policy.py: the rules by what a call does, table-driven (the paths a user
takes: tests/test_policy.py, with a real Home Assistant tests/homeassistant/test_house_policy.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.stack import make_settings
from worker.tools.policy import (
    Policy,
    PolicyError,
    PolicyVerdict,
    Ruling,
    Subject,
    load_policy,
    parse_policy,
)

ALLOW, ASK, DENY = PolicyVerdict.ALLOW, PolicyVerdict.ASK, PolicyVerdict.DENY


def ha(
    domain: str,
    service: str,
    entity: str,
    area: tuple[str, ...] | None = None,
    *,
    known: bool = True,
    **options: Any,
) -> Subject:
    """An `ha_call_service` call as the policy reads it."""
    return Subject(
        tool="ha_call_service",
        declared=True,
        domain=domain,
        service=service,
        entity=entity,
        area=area,
        area_known=known,
        options=options,
    )


def tool(name: str, *, declared: bool = False, server: str | None = None, **args: Any) -> Subject:
    return Subject(tool=name, declared=declared, server=server, options=args)


# (case, subject, verdict, rule) for the household default, worker/tools/policy.toml.
HOUSEHOLD: list[tuple[str, Subject, PolicyVerdict, str]] = [
    (
        "a light",
        ha("light", "turn_on", "light.kitchen"),
        ALLOW,
        "lights, switches, fans, players, scenes",
    ),
    (
        "a switch",
        ha("switch", "turn_off", "switch.porch"),
        ALLOW,
        "lights, switches, fans, players, scenes",
    ),
    (
        "a fan",
        ha("fan", "turn_on", "fan.ceiling"),
        ALLOW,
        "lights, switches, fans, players, scenes",
    ),
    (
        "a player",
        ha("media_player", "media_pause", "media_player.tv"),
        ALLOW,
        "lights, switches, fans, players, scenes",
    ),
    (
        "a scene",
        ha("scene", "turn_on", "scene.movie"),
        ALLOW,
        "lights, switches, fans, players, scenes",
    ),
    ("an unlock", ha("lock", "unlock", "lock.front_door"), ASK, "locks, alarms, covers"),
    ("a lock", ha("lock", "lock", "lock.front_door"), ASK, "locks, alarms, covers"),
    (
        "an alarm",
        ha("alarm_control_panel", "alarm_disarm", "alarm_control_panel.home"),
        ASK,
        "locks, alarms, covers",
    ),
    ("a garage door", ha("cover", "open_cover", "cover.garage"), ASK, "locks, alarms, covers"),
    ("a script", ha("script", "turn_on", "script.good_night"), ASK, "scripts"),
    (
        "a comfortable temperature",
        ha("climate", "set_temperature", "climate.hall", temperature=21.5),
        ALLOW,
        "comfortable climate",
    ),
    (
        "its bounds are in",
        ha("climate", "set_temperature", "climate.hall", temperature=26),
        ALLOW,
        "comfortable climate",
    ),
    (
        "a temperature as text",
        ha("climate", "set_temperature", "climate.hall", temperature="22"),
        ALLOW,
        "comfortable climate",
    ),
    (
        "too hot",
        ha("climate", "set_temperature", "climate.hall", temperature=26.5),
        ASK,
        "other climate",
    ),
    (
        "too cold",
        ha("climate", "set_temperature", "climate.hall", temperature=12),
        ASK,
        "other climate",
    ),
    (
        "too hot as text",
        ha("climate", "set_temperature", "climate.hall", temperature="30"),
        ASK,
        "other climate",
    ),
    (
        "not a number",
        ha("climate", "set_temperature", "climate.hall", temperature="warm"),
        ASK,
        "other climate",
    ),
    (
        "a range too low",
        ha("climate", "set_temperature", "climate.hall", target_temp_low=14, target_temp_high=22),
        ASK,
        "other climate",
    ),
    (
        "a mode only",
        ha("climate", "set_hvac_mode", "climate.hall", hvac_mode="heat"),
        ALLOW,
        "comfortable climate",
    ),
    ("a domain no rule names", ha("vacuum", "start", "vacuum.robot"), ASK, "declared"),
    ("a timer", tool("set_timer"), ALLOW, "timers and notes"),
    ("a note", tool("save_note", declared=True), ALLOW, "timers and notes"),
    ("forgetting notes", tool("delete_note", declared=True), ALLOW, "timers and notes"),
    ("Plex playback", tool("plex_play", declared=True), ALLOW, "Plex playback"),
    ("Plex pause", tool("plex_control", declared=True), ALLOW, "Plex playback"),
    ("an MCP write", tool("home__unlock_door", declared=True, server="home"), ASK, "declared"),
    ("an MCP read", tool("home__get_light", server="home"), ALLOW, "declared"),
    ("a read tool", tool("calculator"), ALLOW, "declared"),
]


@pytest.mark.parametrize(
    ("subject", "verdict", "rule"),
    [case[1:] for case in HOUSEHOLD],
    ids=[case[0] for case in HOUSEHOLD],
)
def test_the_household_default(subject: Subject, verdict: PolicyVerdict, rule: str) -> None:
    assert load_policy(None).rule(subject, "anyone", make_settings()) == Ruling(verdict, rule)


RULES = """
[[rules]]
name = "back door"
entity = "lock.back_*"
decision = "allow"

[[rules]]
name = "kitchen"
area = ["Kitchen", "cuisine"]
decision = "allow"

[[rules]]
name = "garage area"
area = "garage"
decision = "ask"

[[rules]]
server = "home*"
tool = "*__get_*"
decision = "allow"

[[rules]]
name = "dim"
domain = "light"
within = { brightness_pct = [0, 50] }
decision = "allow"

[[rules]]
domain = "LIGHT"
decision = "ask"

[[rules]]
name = "shadowed"
domain = "light"
decision = "allow"

[users.kids]
deny = [
  { name = "no doors", domain = ["lock", "cover"] },
  { area = "garage" },
]
"""

# (case, subject, user, verdict, rule) against RULES.
CUSTOM: list[tuple[str, Subject, str, PolicyVerdict, str]] = [
    ("an entity glob", ha("lock", "unlock", "lock.back_door"), "mum", ALLOW, "back door"),
    ("not that entity", ha("lock", "unlock", "lock.front_door"), "mum", ASK, "declared"),
    (
        "an area by name, any case",
        ha("switch", "turn_on", "switch.kettle", ("kitchen", "k1")),
        "mum",
        ALLOW,
        "kitchen",
    ),
    (
        "an area by id",
        ha("switch", "turn_on", "switch.kettle", ("Küche", "cuisine")),
        "mum",
        ALLOW,
        "kitchen",
    ),
    ("in no area", ha("switch", "turn_on", "switch.kettle", None), "mum", ASK, "declared"),
    # An area Home Assistant could not say: an allowing rule does not match, an asking one does.
    (
        "an area not known",
        ha("switch", "turn_on", "switch.kettle", known=False),
        "mum",
        ASK,
        "garage area",
    ),
    (
        "an MCP server and tool glob",
        tool("home__get_light", declared=True, server="home"),
        "mum",
        ALLOW,
        "rules[3]",
    ),
    (
        "another server",
        tool("office__get_light", declared=True, server="office"),
        "mum",
        ASK,
        "declared",
    ),
    ("no server: not an MCP tool", tool("x__get_y", declared=True), "mum", ASK, "declared"),
    ("within bounds", ha("light", "turn_on", "light.hall", brightness_pct=40), "mum", ALLOW, "dim"),
    ("an option not given", ha("light", "turn_off", "light.hall"), "mum", ALLOW, "dim"),
    (
        "beyond: the next rule, globs any case",
        ha("light", "turn_on", "light.hall", brightness_pct=80),
        "mum",
        ASK,
        "rules[5]",
    ),
    (
        "a bool is no number",
        ha("light", "turn_on", "light.hall", brightness_pct=True),
        "mum",
        ASK,
        "rules[5]",
    ),
    ("denied to a user", ha("lock", "unlock", "lock.back_door"), "kids", DENY, "no doors"),
    (
        "denied by area",
        ha("switch", "turn_on", "switch.x", ("Garage", "garage")),
        "kids",
        DENY,
        "users.kids.deny[1]",
    ),
    # A deny naming an area refuses a call whose area could not be read.
    (
        "denied, area not known",
        ha("switch", "turn_on", "switch.x", known=False),
        "kids",
        DENY,
        "users.kids.deny[1]",
    ),
    (
        "not denied: the rules",
        ha("switch", "turn_on", "switch.k", ("Kitchen",)),
        "kids",
        ALLOW,
        "kitchen",
    ),
    (
        "another user's rules only",
        ha("cover", "open_cover", "cover.garage"),
        "mum",
        ASK,
        "declared",
    ),
]


@pytest.mark.parametrize(
    ("subject", "user", "verdict", "rule"),
    [case[1:] for case in CUSTOM],
    ids=[case[0] for case in CUSTOM],
)
def test_rules_match_on_what_a_call_does_first_match_winning(
    subject: Subject, user: str, verdict: PolicyVerdict, rule: str
) -> None:
    policy = parse_policy(RULES, "rules.toml")
    assert policy.rule(subject, user, make_settings()) == Ruling(verdict, rule)


# (case, variables, subject, user, verdict, rule): the tool-name variables, after a user's
# deny rules and before the file's.
NAMES: list[tuple[str, dict[str, str], Subject, str, PolicyVerdict, str]] = [
    (
        "auto-approved",
        {"auto_approve_tools": "ha_call_service"},
        ha("lock", "unlock", "lock.front_door"),
        "mum",
        ALLOW,
        "BERNARD_AUTO_APPROVE_TOOLS",
    ),
    (
        "confirmed",
        {"confirm_tools": "set_timer,x"},
        tool("set_timer"),
        "mum",
        ASK,
        "BERNARD_CONFIRM_TOOLS",
    ),
    (
        "auto-approve wins",
        {"confirm_tools": "set_timer", "auto_approve_tools": "set_timer"},
        tool("set_timer"),
        "mum",
        ALLOW,
        "BERNARD_AUTO_APPROVE_TOOLS",
    ),
    (
        "a user's deny first",
        {"auto_approve_tools": "ha_call_service"},
        ha("lock", "unlock", "lock.front_door"),
        "kids",
        DENY,
        "no doors",
    ),
]


@pytest.mark.parametrize(
    ("variables", "subject", "user", "verdict", "rule"),
    [case[1:] for case in NAMES],
    ids=[case[0] for case in NAMES],
)
def test_the_tool_name_variables_are_the_simplest_rules(
    variables: dict[str, str], subject: Subject, user: str, verdict: PolicyVerdict, rule: str
) -> None:
    policy = parse_policy(RULES, "rules.toml")
    assert policy.rule(subject, user, make_settings(**variables)) == Ruling(verdict, rule)


def test_the_strictest_ruling_of_several_subjects_stands() -> None:
    policy = parse_policy(RULES, "rules.toml")
    light, front, back = (
        ha("light", "turn_on", "light.hall", brightness_pct=10),
        ha("lock", "unlock", "lock.front_door"),
        ha("lock", "lock", "lock.back_door"),
    )
    settings = make_settings()

    assert policy.rule_all([light, front], "mum", settings) == Ruling(ASK, "declared")
    assert policy.rule_all([light, back], "mum", settings) == Ruling(ALLOW, "dim")
    assert policy.rule_all([light, back], "kids", settings) == Ruling(DENY, "no doors")


def test_areas_are_read_only_when_a_rule_names_one() -> None:
    assert load_policy(None).needs_area("mum") is False
    no_areas = parse_policy('[users.kids]\ndeny = [{ area = "garage" }]', "x.toml")
    assert (no_areas.needs_area("mum"), no_areas.needs_area("kids")) == (False, True)
    assert Policy().needs_area(None) is False


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[[rules]\n", "the policy file bad.toml is not TOML: "),
        (
            '[[rules]]\ndomain = "lock"\ndecision = "maybe"',
            "the policy file bad.toml is not a policy: rules.0.decision: Input should be "
            "'allow' or 'ask'",
        ),
        (
            '[[rules]]\ndomains = "lock"\ndecision = "ask"',
            "the policy file bad.toml is not a policy: rules.0.domains: Extra inputs are not "
            "permitted",
        ),
        (
            '[users.kids]\ndeny = [{ domain = "lock", decision = "ask" }]',
            "the policy file bad.toml is not a policy: users.kids.deny.0.decision: Extra "
            "inputs are not permitted",
        ),
        (
            '[[rules]]\nname = "hot"\nwithin = { temperature = [26, 16] }\ndecision = "ask"',
            "the policy file bad.toml: rule 'hot' bounds an option from 26 to 16",
        ),
        (
            '[[rules]]\nwithin = { temperature = "warm" }\ndecision = "ask"',
            "the policy file bad.toml is not a policy: rules.0.within.temperature: Input "
            "should be a valid tuple",
        ),
    ],
    ids=["not toml", "decision", "unknown key", "deny decides nothing", "bounds", "bound type"],
)
def test_a_file_that_is_no_policy_says_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "bad.toml")
    assert str(raised.value).startswith(said), str(raised.value)


def test_an_unreadable_file_is_named(tmp_path: Any) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(PolicyError) as raised:
        load_policy(str(missing))
    assert str(raised.value).startswith(
        f"the policy file {missing} (BERNARD_POLICY_FILE) cannot be read: "
    )
