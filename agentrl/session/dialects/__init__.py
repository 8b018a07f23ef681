"""The session server's dialects: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages.

Each dialect translates its request into one ledger turn (:class:`~agentrl.session.dialects.common.TurnArgs`)
and the committed :class:`~agentrl.session.backend.ChatResult` back into its own response body
and stream events; none keeps tokens of its own, so every dialect records exactly what the
engine sampled, and a client may switch dialects between turns of one episode.

- :mod:`~agentrl.session.dialects.chat` — ``/v1/chat/completions`` (request model in
  :mod:`agentrl.session.server_wire`)
- :mod:`~agentrl.session.dialects.responses` — ``/v1/responses``
- :mod:`~agentrl.session.dialects.messages` — ``/v1/messages``
- :mod:`~agentrl.session.dialects.common` — the turn, the streamed text, the event stream
"""
