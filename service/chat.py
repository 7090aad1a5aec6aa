"""Chat templates: how ``/v1/chat/completions`` writes a conversation into a model's prompt. A template is a
function of the messages; a family has one when its tokenizer's kind names one (``CHAT_TEMPLATES``), and a
family without one (molecules: a SMILES model has no conversation to continue) is refused with the reason."""

MESSAGE_SEPARATOR = "\n\n"


def plain(messages) -> str:
    """The messages' texts in order, separated by a blank line; the reply continues the text. For a base
    language model (the bundled text model is trained on speeches, without roles), which has no chat format
    to follow: roles are not written, since the model never saw them."""
    return MESSAGE_SEPARATOR.join(m.text for m in messages if m.text) + MESSAGE_SEPARATOR


CHAT_TEMPLATES = {"text": plain}  # a tokenizer's kind (a checkpoint's ``domain``) -> its family's chat template


def chat_template(domain: str):
    """The chat template of a family whose tokenizer is of kind ``domain``, or None."""
    return CHAT_TEMPLATES.get(domain)
