"""What every attention executor shares: LayerZero's attention arguments in a library's terms."""


def bhsd(tensors, attrs):
    """q, k, v as [B, H, S, D] views (no copy) and whether they came as BSHD."""
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    bshd = attrs.get("layouts", {}).get("q", "BSHD") == "BSHD"
    if bshd:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v, bshd


def bshd(tensors, attrs):
    """q, k, v as [B, S, H, D] views (no copy) and whether they came as BHSD."""
    q, k, v = tensors["q"], tensors["k"], tensors["v"]
    heads_first = attrs.get("layouts", {}).get("q", "BSHD") == "BHSD"
    if heads_first:
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return q, k, v, heads_first


def window(attrs):
    """FlashAttention's ``window_size=(left, right)``: right is 0 under causal, unbounded
    (-1) otherwise; left -1 when unbounded."""
    left = attrs.get("window_left")
    return (-1 if left is None else int(left), 0 if attrs.get("causal") else -1)


def top_left_causal(attrs, sq, sk):
    """The ``is_causal`` of a library whose causal mask is top-left (SDPA, ZenDNN) for
    LayerZero's attributes: the same when seq_q == seq_k; a single query aligned bottom-right
    sees every key (no mask); any other bottom-right request is not expressible."""
    causal = bool(attrs.get("causal"))
    if not causal or sq == sk or attrs.get("causal_alignment") == "top_left":
        return causal
    refuse(sq != 1, "this library's causal mask is top-left; bottom-right with seq_q != seq_k is not expressible")
    return False


def refuse(condition, message):
    if condition:
        raise ValueError(message)
