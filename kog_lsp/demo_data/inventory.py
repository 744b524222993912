"""A small inventory module: the file the kog-lsp demo opens and types into."""

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 0
    tags: list[str] = field(default_factory=list)

    def value(self) -> float:
        """Stock value of this item."""
        return self.price * self.quantity


class Inventory:
    def __init__(self):
        self.items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.name in self.items:
            self.items[item.name].quantity += item.quantity
        else:
            self.items[item.name] = item

    def remove(self, name: str, quantity: int = 1) -> bool:
        item = self.items.get(name)
        if item is None or item.quantity < quantity:
            return False
        item.quantity -= quantity
        return True

    def find_by_tag(self, tag: str) -> list[Item]:
        return [item for item in self.items.values() if tag in item.tags]

