"""Every family's chat template renders conversations exactly as that family's published template does.

The expected strings are written out by hand from each family's format (docs/models.md names
the hub file each one follows), including the quirks a session server has to live with.
"""

from __future__ import annotations

from functools import cache

import pytest

from agentrl.models import load_tokenizer

TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate.",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}},
    },
}
TOOL_JSON = (
    '{"type": "function", "function": {"name": "calc", "description": "Evaluate.", '
    '"parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}'
)


def call(expr: str, args_as_string: bool = False) -> dict:
    args = f'{{"expr": "{expr}"}}' if args_as_string else {"expr": expr}
    return {"id": f"call_{expr}", "type": "function", "function": {"name": "calc", "arguments": args}}


@cache
def _tokenizer(model: str):
    return load_tokenizer(model)


def render(model: str, messages: list[dict], **kwargs) -> str:
    return _tokenizer(model).apply_chat_template(messages, tokenize=False, **kwargs)


QWEN_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + TOOL_JSON
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
)
PARALLEL = [
    {"role": "user", "content": "What are 2+3 and 2*3?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "need calc",
        "tool_calls": [call("2+3"), call("2*3")],
    },
    {"role": "tool", "tool_call_id": "call_2+3", "content": "5"},
    {"role": "tool", "tool_call_id": "call_2*3", "content": "6"},
    {"role": "assistant", "content": "5 and 6.", "reasoning_content": "done"},
]


# ---------------------------------------------------------------- Qwen2.5
@pytest.mark.parametrize("model", ["tiny-qwen2.5", "tiny-qwen2.5-realvocab"])
def test_qwen25_default_system_prompt(built, model):
    assert render(model, [{"role": "user", "content": "Hi"}], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(model, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_qwen25_tools_parallel_calls_and_results(built):
    assert render("tiny-qwen2.5", PARALLEL, tools=[TOOL]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n"
        + QWEN_TOOLS_BLOCK
        + "<|im_start|>user\nWhat are 2+3 and 2*3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2*3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n5 and 6.<|im_end|>\n"
    )


def test_qwen25_content_before_calls_and_string_arguments_quoted_again(built):
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call("1+1", args_as_string=True)]},
    ]
    assert render("tiny-qwen2.5", msgs) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "calc", "arguments": "{\\"expr\\": \\"1+1\\"}"}\n'
        "</tool_call><|im_end|>\n"
    )


# ---------------------------------------------------------------- Qwen3 (and tiny, which uses it)
@pytest.mark.parametrize("model", ["tiny", "tiny-qwen3", "tiny-qwen3-realvocab"])
def test_qwen3_generation_prompt_and_enable_thinking(built, model):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render(model, msgs, add_generation_prompt=True) == head
    assert (
        render(model, msgs, add_generation_prompt=True, enable_thinking=False)
        == head + "<think>\n\n</think>\n\n"
    )
    assert (
        render(model, [{"role": "user", "content": "Hi"}]) == "<|im_start|>user\nHi<|im_end|>\n"
    )  # no default system


def test_qwen3_drops_reasoning_of_turns_before_the_last_user_query(built):
    msgs = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "5", "reasoning_content": "add them"},
        {"role": "user", "content": "times 2?"},
        {"role": "assistant", "content": "10", "reasoning_content": "double it"},
    ]
    assert render("tiny-qwen3", msgs) == (
        "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n"
        "<|im_start|>user\ntimes 2?<|im_end|>\n<|im_start|>assistant\n<think>\ndouble it\n</think>\n\n10<|im_end|>\n"
    )


def test_qwen3_reasoning_inside_content_and_empty_think_on_last_turn(built):
    inline = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok"},
    ]
    assert render("tiny-qwen3", inline) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>\n"
    )
    plain = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "ok"}]
    assert render("tiny-qwen3", plain) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nok<|im_end|>\n"
    )
    earlier = [*plain, {"role": "user", "content": "again"}]
    assert render("tiny-qwen3", earlier) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n"
    )


def test_qwen3_tools_parallel_calls_results_and_reasoning(built):
    msgs = [{"role": "system", "content": "S"}, *PARALLEL]
    expected = (
        "<|im_start|>system\nS\n\n" + QWEN_TOOLS_BLOCK + "<|im_start|>user\nWhat are 2+3 and 2*3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nneed calc\n</think>\n\n"
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+3"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "2*3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\ndone\n</think>\n\n5 and 6.<|im_end|>\n"
    )
    assert render("tiny-qwen3", msgs, tools=[TOOL]) == expected
    assert render("tiny", msgs, tools=[TOOL]) == expected


def test_qwen3_string_arguments_are_written_verbatim(built):
    msgs = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call("1+1", args_as_string=True)]},
    ]
    assert render("tiny-qwen3", msgs) == (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nChecking.\n"
        '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+1"}}\n</tool_call><|im_end|>\n'
    )


# ---------------------------------------------------------------- Llama 3.1
LLAMA_HEAD = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
LLAMA_TOOL_JSON = (
    "{\n"
    '    "type": "function",\n'
    '    "function": {\n'
    '        "name": "calc",\n'
    '        "description": "Evaluate.",\n'
    '        "parameters": {\n'
    '            "type": "object",\n'
    '            "properties": {\n'
    '                "expr": {\n'
    '                    "type": "string"\n'
    "                }\n"
    "            }\n"
    "        }\n"
    "    }\n"
    "}"
)


def test_llama3_headers_date_and_eot(built):
    msgs = [
        {"role": "system", "content": "Be brief. "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": " Hello! ", "reasoning_content": "ignored"},
        {"role": "user", "content": "Bye"},
    ]
    assert render("tiny-llama3", msgs, add_generation_prompt=True) == (
        LLAMA_HEAD + "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render("tiny-llama3", msgs[1:2], date_string="01 Dec 2026") == (
        LLAMA_HEAD + "Cutting Knowledge Date: December 2023\nToday Date: 01 Dec 2026\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
    )


def test_llama3_tools_in_first_user_message_call_and_ipython_result(built):
    msgs = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [call("2+3")]},
        {"role": "tool", "tool_call_id": "call_2+3", "content": "5"},
        {"role": "assistant", "content": "5."},
    ]
    assert render("tiny-llama3", msgs, tools=[TOOL]) == (
        LLAMA_HEAD
        + "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Given the following functions, please respond with a JSON for a function call with its proper arguments "
        "that best answers the given prompt.\n\n"
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n" + LLAMA_TOOL_JSON + "\n\n2+3?<|eot_id|>"
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "calc", "parameters": {"expr": "2+3"}}<|eot_id|>'
        '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>'
        "<|start_header_id|>assistant<|end_header_id|>\n\n5.<|eot_id|>"
    )


def test_llama3_tools_in_system_message_when_asked(built):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert render("tiny-llama3", msgs, tools=[TOOL], tools_in_user_message=False) == (
        LLAMA_HEAD
        + "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "You have access to the following functions. To call a function, please respond with JSON for a function "
        'call.Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
        "Do not use variables.\n\n" + LLAMA_TOOL_JSON + "\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
    )


def test_llama3_refuses_parallel_tool_calls(built):
    with pytest.raises(Exception, match="only supports single tool-calls"):
        render("tiny-llama3", PARALLEL, tools=[TOOL])


# ---------------------------------------------------------------- GLM-4-0414
GLM_FUNCTION_JSON = (
    "{\n"
    '    "name": "calc",\n'
    '    "description": "Evaluate.",\n'
    '    "parameters": {\n'
    '        "type": "object",\n'
    '        "properties": {\n'
    '            "expr": {\n'
    '                "type": "string"\n'
    "            }\n"
    "        }\n"
    "    }\n"
    "}"
)


def test_glm4_roles_and_generation_prompt(built):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "ignored"},
        {"role": "user", "content": "Bye"},
    ]
    assert render("tiny-glm4", msgs, add_generation_prompt=True) == (
        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\nHello!<|user|>\nBye<|assistant|>"
    )


def test_glm4_tools_metadata_calls_and_observations(built):
    msgs = [
        {"role": "user", "content": "What are 2+3 and 2*3?"},
        {"role": "assistant", "metadata": "calc", "content": '{"expr": "2+3"}'},
        {"role": "assistant", "metadata": "calc", "content": '{"expr": "2*3"}'},
        {"role": "observation", "content": "5"},
        {"role": "observation", "content": "6"},
        {"role": "assistant", "content": "5 and 6."},
    ]
    assert render("tiny-glm4", msgs, tools=[TOOL]) == (
        "[gMASK]<sop><|system|>\n# \u53ef\u7528\u5de5\u5177\n\n## calc\n\n" + GLM_FUNCTION_JSON + "\n"
        "\u5728\u8c03\u7528\u4e0a\u8ff0\u51fd\u6570\u65f6\uff0c\u8bf7\u4f7f\u7528 Json "
        "\u683c\u5f0f\u8868\u793a\u8c03\u7528\u7684\u53c2\u6570\u3002"
        "<|user|>\nWhat are 2+3 and 2*3?"
        '<|assistant|>calc \n{"expr": "2+3"}<|assistant|>calc \n{"expr": "2*3"}'
        "<|observation|>\n5<|observation|>\n6<|assistant|>\n5 and 6."
    )


def test_glm4_does_not_render_openai_tool_messages(built):
    # GLM-4-0414's template knows only `metadata` calls and `observation` results: OpenAI-shaped tool
    # calls lose their calls and `tool` messages vanish. A session server must convert them first.
    assert render("tiny-glm4", PARALLEL) == (
        "[gMASK]<sop><|user|>\nWhat are 2+3 and 2*3?<|assistant|>\n<|assistant|>\n5 and 6."
    )


def test_glm4_joins_several_tools_and_accepts_bare_functions(built):
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {}}},
        {"name": "b", "parameters": {}},
    ]
    assert render("tiny-glm4", [{"role": "user", "content": "q"}], tools=tools) == (
        "[gMASK]<sop><|system|>\n# \u53ef\u7528\u5de5\u5177\n\n"
        '## a\n\n{\n    "name": "a",\n    "parameters": {}\n}\n'
        "\u5728\u8c03\u7528\u4e0a\u8ff0\u51fd\u6570\u65f6\uff0c\u8bf7\u4f7f\u7528 Json "
        "\u683c\u5f0f\u8868\u793a\u8c03\u7528\u7684\u53c2\u6570\u3002\n"
        '## b\n\n{\n    "name": "b",\n    "parameters": {}\n}\n'
        "\u5728\u8c03\u7528\u4e0a\u8ff0\u51fd\u6570\u65f6\uff0c\u8bf7\u4f7f\u7528 Json "
        "\u683c\u5f0f\u8868\u793a\u8c03\u7528\u7684\u53c2\u6570\u3002<|user|>\nq"
    )
