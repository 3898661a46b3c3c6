"""YAML from an untrusted file, with bounds: node count, alias expansion, nesting, number
length, no duplicate keys.

yaml.safe_load builds no objects of its own choosing, but it still lets a 400-byte document
alias its way to millions of items (a "billion laughs": every later walk over the data, or a
repr of it in an error message, then takes minutes and gigabytes), nests until Python's
recursion limit, turns a 5000-digit number into a ValueError traceback, and keeps the last of
two equal keys without a word. BoundedLoader refuses each of these with the line it is on.
"""

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from collbench.bounded_repr import bounded_repr, bounded_text

MAX_NODES = 10_000         # nodes written out (a config has a few hundred; parsing 10,000 takes ~0.5 s)
MAX_ALIAS_NODES = 10_000   # nodes that aliases may add, all aliases together
MAX_DEPTH = 64             # nesting of sequences and mappings
MAX_NUMBER_CHARS = 100     # characters of one int or float scalar
MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLRefused(yaml.YAMLError):
    """The document is well-formed YAML but past a bound (or has a duplicate key)."""

    def __init__(self, message, mark=None):
        self.message = message
        self.line = mark.line + 1 if mark is not None else None
        super().__init__(message)

    @property
    def where(self):
        return f"line {self.line}" if self.line else None

    def __str__(self):
        return f"{self.where}: {self.message}" if self.where else self.message


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses alias bombs, recursive aliases, deep nesting, huge numbers and
    duplicate mapping keys."""

    def __init__(self, stream):
        super().__init__(stream)
        self.nodes = 0
        self.alias_nodes = 0
        self.depth = 0

    # ---- composer: sizes are counted while the node graph is built, before anything expands
    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:   # an undefined alias is the composer's own error
                size = getattr(node, "expanded_nodes", None)
                name = bounded_text(event.anchor, 40)
                if size is None:   # its anchor's node is still being composed: it contains itself
                    raise YAMLRefused(f"alias *{name} is inside the node it refers to "
                                      "(a recursive structure)", event.start_mark)
                self.alias_nodes += size
                if self.alias_nodes > MAX_ALIAS_NODES:
                    raise YAMLRefused(f"aliases expand to more than {MAX_ALIAS_NODES} nodes (at alias *{name}); "
                                      "an alias bomb? write the values out instead", event.start_mark)
            return super().compose_node(parent, index)
        self.depth += 1
        self.nodes += 1
        try:
            if self.depth > MAX_DEPTH:
                raise YAMLRefused(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            if self.nodes > MAX_NODES:
                raise YAMLRefused(f"more than {MAX_NODES} values (a config has a few hundred; "
                                  "long host lists belong in a hostfile)", self.peek_event().start_mark)
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, SequenceNode):
            node.expanded_nodes = 1 + sum(child.expanded_nodes for child in node.value)
        elif isinstance(node, MappingNode):
            node.expanded_nodes = 1 + sum(k.expanded_nodes + v.expanded_nodes for k, v in node.value)
        else:
            node.expanded_nodes = 1
        return node

    # ---- constructor
    def flatten_mapping(self, node):
        # Checked on the pairs as written, once, before merge keys (<<) add theirs: a key given
        # explicitly may override a merged one, but not one written earlier in the same mapping.
        if not getattr(node, "keys_checked", False):
            node.keys_checked = True
            seen = {}
            for index, (key_node, _) in enumerate(node.value):
                if key_node.tag == MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, index)
                except TypeError:
                    continue
                if first != index:
                    first_line = node.value[first][0].start_mark.line + 1
                    raise YAMLRefused(f"duplicate key {bounded_repr(key)} (first at line {first_line}); "
                                      "YAML would silently keep the last one", key_node.start_mark)
        super().flatten_mapping(node)

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as e:   # e.g. a timestamp with month 13
            raise YAMLRefused(f"cannot read the value: {bounded_text(e, 200)}", node.start_mark) from None


def _bounded_number(construct):
    def construct_bounded(loader, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise YAMLRefused(f"a number of {len(node.value)} characters (at most {MAX_NUMBER_CHARS})",
                              node.start_mark)
        return construct(loader, node)
    return construct_bounded


BoundedLoader.add_constructor("tag:yaml.org,2002:int", _bounded_number(SafeConstructor.construct_yaml_int))
BoundedLoader.add_constructor("tag:yaml.org,2002:float", _bounded_number(SafeConstructor.construct_yaml_float))


def load_bounded(text):
    """The one document in `text`; YAMLRefused past a bound, yaml.YAMLError if not YAML."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    except RecursionError:   # MAX_DEPTH keeps well below the limit; this is a last resort
        raise YAMLRefused("nested too deeply") from None
    finally:
        loader.dispose()
