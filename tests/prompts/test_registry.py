import pytest

from biaslab.errors import UserError
from biaslab.prompts.registry import PromptRegistry


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_packaged_prompts_load_and_declare_their_slots():
    registry = PromptRegistry()
    refs = {t.ref for t in registry.list()}
    assert {"amplification/explanation", "amplification/predict", "amplification/judge",
            "amplification/predict_with_explanation", "exposures/covert_favor",
            "common/reask"} <= refs
    predict = registry.get("amplification/predict")
    assert predict.slots == ("records", "n")
    messages = predict.render({"records": "1. a=b", "n": 1, "unused": "x"})
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "1. a=b" in messages[1]["content"] and "$" not in messages[1]["content"]


def test_missing_slot_value_is_an_error_naming_template_and_slot():
    with pytest.raises(UserError, match=r"amplification/predict: no value for slot 'n'"):
        PromptRegistry().get("amplification/predict").render({"records": "x"})


@pytest.mark.parametrize("body, message", [
    ('slots = ["a"]\nuser = "hi $a $b"', "uses slot '\\$b' that is not declared"),
    ('slots = ["a", "b"]\nuser = "hi $a"', "declares slot 'b' but never uses it"),
    ('slots = []\nuser = ""', "non-empty 'user'"),
    ('slots = []\nuser = "x"\ncolour = 1', "unknown key 'colour'"),
    ('user = "unclosed', "not valid TOML"),
    ('slots = ["q"]\nconversation = "h"\nuser = "$q"', "'conversation' must name one of"),
    ('slots = ["h", "q"]\nconversation = "h"\nuser = "$h $q"', "sent as chat turns"),
])
def test_bad_templates_fail_at_load_time(tmp_path, body, message):
    write(tmp_path / "mine" / "node.toml", body)
    with pytest.raises(UserError, match=message) as err:
        PromptRegistry([tmp_path]).get("mine/node")
    assert "mine/node" in str(err.value) and "\n" not in str(err.value)


def test_override_directory_shadows_packaged_prompt_and_adds_variants(tmp_path):
    write(tmp_path / "amplification" / "predict.toml",
          'slots = ["records", "n"]\nuser = "Rate $n: $records"')
    write(tmp_path / "amplification" / "predict.terse.toml", 'slots = ["n"]\nuser = "Give $n."')
    registry = PromptRegistry([tmp_path])
    shadowed = registry.get("amplification/predict")
    assert shadowed.user == "Rate $n: $records" and shadowed.source.startswith(str(tmp_path))
    terse = registry.get("amplification/predict@terse")
    assert terse.ref == "amplification/predict@terse"
    assert terse.content_hash != shadowed.content_hash
    assert PromptRegistry().get("amplification/predict").content_hash != shadowed.content_hash


def test_prompt_by_file_path_and_unknown_prompt(tmp_path):
    path = write(tmp_path / "x.toml", 'slots = ["n"]\nuser = "n=$n"')
    assert PromptRegistry().get(str(path)).render({"n": 3})[0]["content"] == "n=3"
    with pytest.raises(UserError, match="unknown prompt 'amplification/nope'.*amplification/judge"):
        PromptRegistry().get("amplification/nope")


def test_check_slots_names_node_and_slot():
    judge = PromptRegistry().get("amplification/judge")
    with pytest.raises(UserError, match="declares slot 'p_ml', but node 'prediction'"):
        judge.check_slots(["record", "explanation", "p_llm"], "prediction")


def test_a_conversation_slot_is_sent_as_native_chat_turns(tmp_path):
    """The conversation slot's messages go between the system text and the user text, as
    they are; the other slots fill the texts as usual."""
    write(tmp_path / "mine" / "chat.toml", 'slots = ["history", "query", "tone"]\n'
          'conversation = "history"\nsystem = "Be $tone."\nuser = "$query"')
    template = PromptRegistry([tmp_path]).get("mine/chat")
    history = [{"role": "user", "content": "Hi $tone"}, {"role": "assistant", "content": "Hello"}]
    assert template.render({"history": history, "query": "And now?", "tone": "brief"}) == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi $tone"},
        {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "And now?"}]
    assert template.render({"history": [], "query": "First", "tone": "kind"}) == [
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "First"}]
    with pytest.raises(TypeError, match="must be a list of"):
        template.render({"history": "User: hi", "query": "q", "tone": "t"})


def test_every_packaged_prompt_renders_as_string_template_fills_it():
    """Rendering joins pieces cut once; it gives what string.Template gives for every packaged
    prompt (and, below, for the placeholder forms a user's file may use)."""
    import string

    from biaslab.prompts.registry import escape_quoted

    for template in PromptRegistry().list():
        values = {slot: f"<{slot}> = $x ${{y}} $$" for slot in template.slots}
        if template.conversation:
            values[template.conversation] = [{"role": "user", "content": "earlier"}]
        filled = {s: escape_quoted(v) if s in template.quoted else v
                  for s, v in values.items() if s != template.conversation}
        messages = template.render(values)
        assert messages[-1]["content"] == string.Template(template.user).substitute(filled)
        if template.system.strip():
            assert messages[0]["content"] == string.Template(template.system).substitute(filled)


def test_placeholder_forms_render_as_string_template_fills_them(tmp_path):
    import string

    user = "Cost $$5 for ${a}b, $a again, $$$b, and ${b}."
    path = write(tmp_path / "x.toml", f'slots = ["a", "b"]\nsystem = "S $a"\nuser = "{user}"')
    values = {"a": "A $b ${a}", "b": 7}
    messages = PromptRegistry().get(str(path)).render(values)
    expected = string.Template(user).substitute({"a": "A $b ${a}", "b": "7"})
    assert messages == [{"role": "system", "content": "S A $b ${a}"},
                        {"role": "user", "content": expected}]
    assert expected == "Cost $5 for A $b ${a}b, A $b ${a} again, $7, and 7."
