"""Drive a served environment over raw HTTP, knowing only its OpenAPI schema.

Start a server first, e.g. the example env::

    PYTHONPATH=examples agentrl serve-env --import reverse_env --env reverse-v0 --port 8100
    python examples/drive_env_over_http.py http://127.0.0.1:8100 reverse-v0

Or with curl::

    curl -s -X POST localhost:8100/episodes -H 'content-type: application/json' -d '{"env_id": "reverse-v0"}'
    curl -s -X POST localhost:8100/episodes/ID/reset -H 'content-type: application/json' -d '{"seed": 1}'
    curl -s -X POST localhost:8100/episodes/ID/step -H 'content-type: application/json' \\
         -d '{"action": {"role": "assistant", "content": "<answer>tnega</answer>"}}'

This client imports nothing from agentrl: it reads /openapi.json to find the
episode routes and their request bodies, then plays one episode of the reverse
env (it reverses the quoted word in the prompt) and prints the reward.
"""

from __future__ import annotations

import re
import sys

import httpx


def main(url: str, env_id: str) -> float:
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30.0, connect=5.0)) as http:
        schema = http.get("/openapi.json").json()
        paths = schema["paths"]
        create_path = next(p for p in paths if p.rstrip("/") == "/episodes" and "post" in paths[p])
        reset_path = next(p for p in paths if p.endswith("/reset"))
        step_path = next(p for p in paths if p.endswith("/step"))
        step_body = paths[step_path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        required = schema["components"]["schemas"][step_body.split("/")[-1]]["required"]
        assert required == ["action"], required  # the schema says: {"action": <Message>}

        created = http.post(create_path, json={"env_id": env_id})
        created.raise_for_status()
        episode = created.json()["episode_id"]
        obs = http.post(reset_path.replace("{episode_id}", episode), json={"seed": 1}).json()
        prompt = obs["messages"][-1]["content"]
        print("prompt:", prompt)
        word = re.search(r"'([^']+)'", prompt)
        answer = word.group(1)[::-1] if word else ""
        action = {"role": "assistant", "content": f"<answer>{answer}</answer>"}
        result = http.post(step_path.replace("{episode_id}", episode), json={"action": action}).json()
        print("reward:", result["reward"], "terminated:", result["terminated"])
        http.delete(f"{create_path}/{episode}")
        return float(result["reward"])


if __name__ == "__main__":
    sys.exit(
        0
        if main(
            sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8100",
            sys.argv[2] if len(sys.argv) > 2 else "reverse-v0",
        )
        == 1.0
        else 1
    )
