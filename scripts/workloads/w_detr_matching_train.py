"""DETR-style set-prediction training (Carion et al., 2020), its loss and matcher written as DETR's
reference code (models/matcher.py, models/detr.py) with the matcher's loop over the images that
many reimplementations have: a small CNN backbone in place of DETR's ResNet-50 (four stride-2 3 x
3 convolutions with BatchNorm and ReLU, 64 to 256 channels, then a 1 x 1 projection to 256: 16 x
16 features from 256 x 256 images), DETR's sine position embedding, and a 6-layer transformer
decoder written as DETR's (post-norm layers of ``nn.MultiheadAttention``, 8 heads, 2048-wide
feed-forward, dropout 0.1; 100 learned queries, the query position added at every layer, the
encoder left out); a class head (91 classes and "no object") and a 3-layer box MLP (sigmoid: cx,
cy, w, h) on every layer's output, each layer's predictions scored (DETR's auxiliary losses).
Each of the 6 x 16 (layer, image) pairs is matched on the host: its cost matrix (100 queries x
its targets: -p(class) + 5 * L1 of the boxes + 2 * -GIoU) built on the GPU for that image alone,
copied to the host (``.cpu()``) and solved with ``scipy.optimize.linear_sum_assignment`` (the
Hungarian matching, as DETR) where SciPy is importable, else by a NumPy greedy matcher (the
cheapest remaining pair first: not optimal); the program says which it used. The loss is
DETR's SetCriterion: cross entropy over all queries (weight 0.1 for "no object"), L1 and GIoU
of the matched boxes over the number of targets, summed over the 6 layers; the matched indices
are host tensors that index the GPU's outputs and targets. Batch 16 of random images, each with
5-30 random targets (drawn ahead and moved to the GPU each step, as a loader's per-image dicts
are), AdamW (lr 1e-4, the backbone's 1e-5, weight decay 1e-4, PyTorch's default foreach
implementation), fp32 (cuDNN's convolutions in TF32, its default).

Each training step is an NVTX range ``train_step`` (``forward``, holding ``matching``, then
``backward``, ``optimizer``).

Defect (if any): 96 small matchings a step, each ~40 launches of 100 x 5-30 elementwise work
(softmax, a gather, ``cdist``, the GIoU's boxes) ending in a copy to the host that waits for the
GPU, then the solver on the host while the GPU idles; the loss's per-image index tensors then
come back to the GPU in ~200 small copies. About 6,400 launches (4,800 of them the matching's)
and 96 waits a step against ~200 GFLOP of work (the decoder's fp32 GEMMs most of it).

    python w_detr_matching_train.py [--steps 30] [--fix batched_cost | --fix gpu_greedy] [--fix bf16]
        [--fix fused_adamw]

Fixes:
  batched_cost  all 6 x 16 cost matrices in one batched computation (the targets padded to the
                batch's most), copied to the host once a step, then matched image by image by
                the same solver (DETR's own matcher batches its cost so, per layer).
  gpu_greedy    the batched cost matched on the GPU by a greedy matcher (the cheapest remaining
                (query, target) pair of every matrix at once, its row and column then masked, as
                many rounds as the batch's most targets): no copy to the host, and the loss's
                indices stay on the GPU. It approximates the Hungarian matching (its total cost
                is at least the optimum's): the training's objective changes.
  bf16          bf16 autocast over the forward and the loss (the matcher's costs in float32).
  fused_adamw   ``AdamW(fused=True)``.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _corpus import bf16_autocast, nvtx, program_args, run, train_step  # noqa: E402 (the workloads' shared helpers)

try:
    from scipy.optimize import linear_sum_assignment
except ImportError:        # the greedy matcher instead (the program must run without SciPy)
    linear_sum_assignment = None

FIXES = ("batched_cost", "gpu_greedy", "bf16", "fused_adamw")
CUDA_ONLY: tuple[str, ...] = ()
ALTERNATIVES = (("batched_cost", "gpu_greedy"),)
COST_CLASS, COST_BBOX, COST_GIOU = 1.0, 5.0, 2.0
EOS_COEF = 0.1
MATCHER = "hungarian" if linear_sum_assignment is not None else "greedy"


# --- boxes ---------------------------------------------------------------------------------------

def box_cxcywh_to_xyxy(x: torch.Tensor) -> torch.Tensor:
    cx, cy, w, h = x.unbind(-1)
    return torch.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], dim=-1)


def box_area(b: torch.Tensor) -> torch.Tensor:
    return (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])


def generalized_box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """GIoU of every box of ``boxes1`` [..., N, 4] with every box of ``boxes2`` [..., M, 4]
    (x0, y0, x1, y1): [..., N, M], as DETR's box_ops (with leading batch dimensions)."""
    area1, area2 = box_area(boxes1), box_area(boxes2)
    lt = torch.max(boxes1[..., :, None, :2], boxes2[..., None, :, :2])
    rb = torch.min(boxes1[..., :, None, 2:], boxes2[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1[..., :, None] + area2[..., None, :] - inter
    iou = inter / union
    lt = torch.min(boxes1[..., :, None, :2], boxes2[..., None, :, :2])
    rb = torch.max(boxes1[..., :, None, 2:], boxes2[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    area = wh[..., 0] * wh[..., 1]
    return iou - (area - union) / area


# --- the matchers --------------------------------------------------------------------------------

@torch.no_grad()
def match_cost(logits: torch.Tensor, boxes: torch.Tensor, tgt_labels: torch.Tensor, tgt_boxes: torch.Tensor
               ) -> torch.Tensor:
    """DETR's matching cost of queries against targets, in float32: ``logits`` [..., Q, C+1],
    ``boxes`` [..., Q, 4] (cx, cy, w, h), ``tgt_labels`` [..., T], ``tgt_boxes`` [..., T, 4]
    (leading dimensions broadcast): [..., Q, T]."""
    prob = logits.float().softmax(-1)
    boxes = boxes.float()
    idx = tgt_labels[..., None, :].expand(*prob.shape[:-1], tgt_labels.shape[-1])
    cost_class = -prob.gather(-1, idx)
    cost_bbox = torch.cdist(boxes, tgt_boxes, p=1)
    cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(tgt_boxes))
    return COST_BBOX * cost_bbox + COST_CLASS * cost_class + COST_GIOU * cost_giou


def greedy_numpy(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A greedy matching of the rows and columns of ``c`` [Q, T] (Q >= T): the cheapest remaining
    pair first, its row and column then taken. (rows, columns), sorted by row."""
    c = np.array(c, dtype=np.float64)
    rows, cols = [], []
    for _ in range(min(c.shape)):
        r, k = np.unravel_index(np.argmin(c), c.shape)
        rows.append(r)
        cols.append(k)
        c[r, :] = np.inf
        c[:, k] = np.inf
    order = np.argsort(rows)
    return np.asarray(rows, dtype=np.int64)[order], np.asarray(cols, dtype=np.int64)[order]


def solve(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The assignment of ``c`` [Q, T]: SciPy's Hungarian matching, else the greedy one."""
    if linear_sum_assignment is not None:
        return linear_sum_assignment(c)
    return greedy_numpy(c)


@torch.no_grad()
def greedy_torch(cost: torch.Tensor, rounds: int) -> torch.Tensor:
    """The greedy matching of every matrix of ``cost`` [N, Q, T] (inf where no target) at once,
    on its device: ``rounds`` rounds, each taking the cheapest remaining pair of every matrix and
    masking its row and column. [N, T]: the query matched to each target (-1: none)."""
    n, q, t = cost.shape
    cost = cost.clone()
    assign = torch.full((n, t), -1, dtype=torch.long, device=cost.device)
    rows = torch.arange(n, device=cost.device)
    queries, targets = torch.arange(q, device=cost.device), torch.arange(t, device=cost.device)
    for _ in range(rounds):
        v, at = cost.view(n, q * t).min(1)
        qi, ti = at // t, at % t
        ok = torch.isfinite(v)
        assign[rows, ti] = torch.where(ok, qi, assign[rows, ti])
        cost.masked_fill_(((queries == qi[:, None]) & ok[:, None])[:, :, None], math.inf)
        cost.masked_fill_(((targets == ti[:, None]) & ok[:, None])[:, None, :], math.inf)
    return assign


class Matcher:
    """The (query, target) indices of every layer's predictions for every image: a list over the
    layers of DETR's list over the images of (queries, targets) index tensors. ``mode``:
    "per_image" (the baseline: each image's cost built and copied to the host alone), "batched"
    (all costs at once, one copy) or "gpu_greedy" (no copy: GPU indices)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __call__(self, logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict]) -> list[list[tuple]]:
        with nvtx("matching"):
            if self.mode == "per_image":
                return [[self.one(logits[li, b], boxes[li, b], t) for b, t in enumerate(targets)]
                        for li in range(logits.shape[0])]
            labels, tboxes, counts = pad_targets(targets)
            cost = match_cost(logits, boxes, labels[None], tboxes[None])       # [L, B, Q, T]
            if self.mode == "batched":
                c = cost.cpu().numpy()                                          # the one wait
                return [[as_indices(*solve(c[li, b, :, :n])) for b, n in enumerate(counts)]
                        for li in range(c.shape[0])]
            n_layers, b, q, t = cost.shape
            valid = torch.arange(t, device=cost.device)[None, :] < torch.tensor(counts, device=cost.device)[:, None]
            cost = cost.masked_fill(~valid[None, :, None, :], math.inf)
            assign = greedy_torch(cost.view(n_layers * b, q, t), max(counts)).view(n_layers, b, t)
            return [[(assign[li, bi, :n], targets[bi]["order"]) for bi, n in enumerate(counts)]
                    for li in range(n_layers)]

    @staticmethod
    def one(logits: torch.Tensor, boxes: torch.Tensor, target: dict) -> tuple[torch.Tensor, torch.Tensor]:
        c = match_cost(logits, boxes, target["labels"], target["boxes"])
        return as_indices(*solve(c.cpu().numpy()))                               # a wait per image


def as_indices(rows, cols) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64)


def pad_targets(targets: list[dict]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The targets padded to the batch's most: labels [B, T] (0), boxes [B, T, 4] (a valid box),
    and each image's count."""
    counts = [int(t["labels"].shape[0]) for t in targets]
    labels = nn.utils.rnn.pad_sequence([t["labels"] for t in targets], batch_first=True)
    boxes = nn.utils.rnn.pad_sequence([t["boxes"] for t in targets], batch_first=True, padding_value=0.25)
    return labels, boxes, counts


# --- the loss (DETR's SetCriterion) --------------------------------------------------------------

def src_permutation(indices: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    batch_idx = torch.cat([torch.full_like(src, i) for i, (src, _) in enumerate(indices)])
    src_idx = torch.cat([src for src, _ in indices])
    return batch_idx, src_idx


def set_loss(logits: torch.Tensor, boxes: torch.Tensor, targets: list[dict], indices: list[tuple],
             num_boxes: float, empty_weight: torch.Tensor) -> torch.Tensor:
    """One layer's loss: cross entropy of every query's class (the unmatched ones "no object"),
    and the matched boxes' L1 and GIoU over ``num_boxes``, weighted 1, 5, 2."""
    n_classes = logits.shape[-1] - 1
    idx = src_permutation(indices)
    target_classes_o = torch.cat([t["labels"][j] for t, (_, j) in zip(targets, indices)])
    target_classes = torch.full(logits.shape[:2], n_classes, dtype=torch.int64, device=logits.device)
    target_classes[idx] = target_classes_o
    loss_ce = F.cross_entropy(logits.transpose(1, 2), target_classes, empty_weight)
    src_boxes = boxes[idx]
    target_boxes = torch.cat([t["boxes"][j] for t, (_, j) in zip(targets, indices)], dim=0)
    loss_bbox = F.l1_loss(src_boxes, target_boxes, reduction="none").sum() / num_boxes
    giou = torch.diag(generalized_box_iou(box_cxcywh_to_xyxy(src_boxes), box_cxcywh_to_xyxy(target_boxes)))
    loss_giou = (1 - giou).sum() / num_boxes
    return loss_ce + 5.0 * loss_bbox + 2.0 * loss_giou


# --- the model -----------------------------------------------------------------------------------

def position_sine(b: int, h: int, w: int, d: int, dev: torch.device, temperature: float = 10000.0) -> torch.Tensor:
    """DETR's PositionEmbeddingSine (normalised, no padding mask): [B, d, h, w]."""
    not_mask = torch.ones(b, h, w, device=dev)
    y_embed, x_embed = not_mask.cumsum(1), not_mask.cumsum(2)
    eps, scale = 1e-6, 2 * math.pi
    y_embed = y_embed / (y_embed[:, -1:, :] + eps) * scale
    x_embed = x_embed / (x_embed[:, :, -1:] + eps) * scale
    npf = d // 2
    dim_t = torch.arange(npf, dtype=torch.float32, device=dev)
    dim_t = temperature ** (2 * (dim_t // 2) / npf)
    pos_x, pos_y = x_embed[:, :, :, None] / dim_t, y_embed[:, :, :, None] / dim_t
    pos_x = torch.stack((pos_x[:, :, :, 0::2].sin(), pos_x[:, :, :, 1::2].cos()), dim=4).flatten(3)
    pos_y = torch.stack((pos_y[:, :, :, 0::2].sin(), pos_y[:, :, :, 1::2].cos()), dim=4).flatten(3)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


class DecoderLayer(nn.Module):
    """DETR's TransformerDecoderLayer, post-norm (sequence-first tensors)."""

    def __init__(self, d: int, heads: int, ffn: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d, heads, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(d, heads, dropout=dropout)
        self.linear1, self.linear2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.dropout, self.dropout1 = nn.Dropout(dropout), nn.Dropout(dropout)
        self.dropout2, self.dropout3 = nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, tgt, memory, pos, query_pos):
        q = k = tgt + query_pos
        tgt2 = self.self_attn(q, k, value=tgt)[0]
        tgt = self.norm1(tgt + self.dropout1(tgt2))
        tgt2 = self.multihead_attn(query=tgt + query_pos, key=memory + pos, value=memory)[0]
        tgt = self.norm2(tgt + self.dropout2(tgt2))
        tgt2 = self.linear2(self.dropout(F.relu(self.linear1(tgt))))
        return self.norm3(tgt + self.dropout3(tgt2))


class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int, layers: int) -> None:
        super().__init__()
        dims = [d_in] + [hidden] * (layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:] + [d_out]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = F.relu(layer(x)) if i < len(self.layers) - 1 else layer(x)
        return x


def backbone(widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    cin = 3
    for w in widths:
        layers += [nn.Conv2d(cin, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True)]
        cin = w
    return nn.Sequential(*layers)


class DETR(nn.Module):
    """Backbone, decoder and heads: every layer's class logits [L, B, Q, C+1] and boxes [L, B, Q, 4]."""

    def __init__(self, widths, d: int, heads: int, ffn: int, layers: int, queries: int, classes: int) -> None:
        super().__init__()
        self.backbone = backbone(widths)
        self.input_proj = nn.Conv2d(widths[-1], d, 1)
        self.query_embed = nn.Embedding(queries, d)
        self.layers = nn.ModuleList(DecoderLayer(d, heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.class_embed = nn.Linear(d, classes + 1)
        self.bbox_embed = MLP(d, d, 4, 3)
        self.d = d

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        src = self.input_proj(self.backbone(images))
        b, d, h, w = src.shape
        pos = position_sine(b, h, w, d, images.device).flatten(2).permute(2, 0, 1)
        memory = src.flatten(2).permute(2, 0, 1)                      # [HW, B, d]
        query_pos = self.query_embed.weight.unsqueeze(1).repeat(1, b, 1)
        tgt = torch.zeros_like(query_pos)
        hs = []
        for layer in self.layers:
            tgt = layer(tgt, memory, pos, query_pos)
            hs.append(self.norm(tgt))
        hs = torch.stack(hs).transpose(1, 2)                          # [L, B, Q, d]
        return self.class_embed(hs), self.bbox_embed(hs).sigmoid()


# --- the data ------------------------------------------------------------------------------------

def random_targets(batch: int, classes: int, lo: int, hi: int, g: torch.Generator) -> list[dict]:
    """One batch's targets on the host: per image ``lo``-``hi`` boxes (cx, cy, w, h inside the
    image) and their classes."""
    out = []
    for _ in range(batch):
        n = int(torch.randint(lo, hi + 1, (1,), generator=g))
        wh = torch.rand(n, 2, generator=g) * 0.25 + 0.05
        c = torch.rand(n, 2, generator=g) * (1 - wh) + wh / 2
        out.append({"labels": torch.randint(0, classes, (n,), generator=g), "boxes": torch.cat([c, wh], 1)})
    return out


def to_device(targets: list[dict], dev: torch.device) -> list[dict]:
    """A loader's per-image dicts moved to the GPU, as DETR's engine does; ``order``: 0..n-1 (the
    targets' own indices, for a matcher that gives the query matched to each target)."""
    out = [{k: v.to(dev) for k, v in t.items()} for t in targets]
    for t in out:
        t["order"] = torch.arange(t["labels"].shape[0], device=dev)
    return out


def build(args, fixes: set[str], dev: torch.device) -> Callable[[], torch.Tensor]:
    """The model, the matcher and AdamW with ``fixes`` applied; returns one training step (fresh
    images, the next targets of a drawn pool; its loss)."""
    widths, d, heads, ffn, layers, queries, classes = (64, 128, 256, 256), 256, 8, 2048, 6, 100, 91
    batch, size, lo, hi, pool = 16, 256, 5, 30, 8
    if args.small:
        widths, d, heads, ffn, layers, queries, classes = (8, 8, 16, 16), 16, 2, 32, 2, 12, 5
        batch, size, lo, hi, pool = 3, 32, 1, 6, 2
    torch.manual_seed(0)
    model = DETR(widths, d, heads, ffn, layers, queries, classes).to(dev).train()
    mode = "batched" if "batched_cost" in fixes else "gpu_greedy" if "gpu_greedy" in fixes else "per_image"
    matcher = Matcher(mode)
    empty_weight = torch.ones(classes + 1, device=dev)
    empty_weight[-1] = EOS_COEF
    groups = [{"params": [p for n, p in model.named_parameters() if not n.startswith("backbone")]},
              {"params": list(model.backbone.parameters()), "lr": 1e-5}]
    opt = torch.optim.AdamW(groups, lr=1e-4, weight_decay=1e-4, fused=True if "fused_adamw" in fixes else None)
    amp = bf16_autocast(dev, "bf16" in fixes)
    g = torch.Generator().manual_seed(7)
    pools = [random_targets(batch, classes, lo, hi, g) for _ in range(pool)]
    at = [0]

    def forward(images: torch.Tensor, targets: list[dict]) -> torch.Tensor:
        logits, boxes = model(images)
        indices = matcher(logits, boxes, targets)
        num_boxes = float(max(sum(int(t["labels"].shape[0]) for t in targets), 1))
        return sum(set_loss(logits[li], boxes[li], targets, indices[li], num_boxes, empty_weight)
                   for li in range(logits.shape[0]))

    def step() -> torch.Tensor:
        targets = to_device(pools[at[0] % pool], dev)
        at[0] += 1
        images = torch.rand(batch, 3, size, size, device=dev)
        return train_step(lambda: forward(images, targets), opt, amp)
    step.model, step.matcher, step.forward, step.pools, step.opt = model, matcher, forward, pools, opt
    return step


def main() -> None:
    args, fixes, dev = program_args(__doc__, FIXES, CUDA_ONLY, ALTERNATIVES, steps=30,
                                    small_help="tiny model, images and targets, for a CPU smoke run")
    ran = run(build, args, fixes, dev)
    if ran:
        print(f"w_detr_matching_train: {args.steps} steps, fixes {sorted(fixes) or 'none'}, "
              f"last loss {ran[1][-1].item():.3f}, host matcher {MATCHER}")


if __name__ == "__main__":
    main()
