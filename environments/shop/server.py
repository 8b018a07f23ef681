"""The shop's MCP server: a price list behind two tools, over stdio (default) or streamable HTTP.

Run ``python server.py`` for stdio (what :class:`~environments.shop.env.ShopEnv` starts) or
``python server.py --http PORT`` to serve ``http://127.0.0.1:PORT/mcp``. The file stands alone
(only the ``mcp`` SDK) so any MCP client can start it; the env imports ``PRICES`` to score.
"""

from __future__ import annotations

import sys

# cents per item; the model cannot know them without asking the server
PRICES = {
    "apple": 137, "banana": 89, "bread": 412, "butter": 365, "carrot": 58, "cheese": 729,
    "coffee": 1149, "eggs": 388, "flour": 243, "honey": 877, "lemon": 71, "milk": 196,
    "olive oil": 1034, "onion": 47, "pasta": 268, "pear": 124, "rice": 315, "salt": 99,
    "sugar": 187, "tea": 533, "tomato": 93, "yogurt": 152,
}  # fmt: skip


def build() -> object:
    from mcp.server.fastmcp import FastMCP

    shop = FastMCP("shop", log_level="WARNING")

    @shop.tool()
    def price(item: str) -> int:
        """The price of one unit of an item, in cents.

        Args:
            item: the item's name as list_items spells it, e.g. "olive oil"
        """
        key = item.strip().lower()
        if key not in PRICES:
            raise ValueError(f"no item {item!r} in the shop; list_items names them all")
        return PRICES[key]

    @shop.tool()
    def list_items() -> list[str]:
        """The names of every item the shop sells."""
        return sorted(PRICES)

    return shop


def main(argv: list[str]) -> None:
    shop = build()
    if "--http" in argv:
        port = int(argv[argv.index("--http") + 1])
        shop.settings.host, shop.settings.port = "127.0.0.1", port  # type: ignore[attr-defined]
        shop.run(transport="streamable-http")  # type: ignore[attr-defined]
    else:
        shop.run()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main(sys.argv[1:])
