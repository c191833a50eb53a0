"""Models the capture tests build: written here, nothing is downloaded."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint


# --- GPT-2 style: tied embeddings, _init_weights after construction --------

class GPT2Block(nn.Module):
    def __init__(self, d, heads, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = self.attn_dropout(att.masked_fill(mask, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.resid_dropout(self.c_proj(y))
        h = self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + self.resid_dropout(h)


class GPT2(nn.Module):
    def __init__(self, vocab=128, d=32, heads=4, layers=2, context=16, dropout=0.0,
                 checkpoint=None):
        super().__init__()
        # torch.utils.checkpoint around each block: None, "reentrant" or
        # "non-reentrant" (use_reentrant=False).
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.drop(self.wte(ids) + self.wpe(torch.arange(t)))
        for block in self.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(
                    block, x, use_reentrant=self.checkpoint == "reentrant")
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))


# --- LLaMA style: RMSNorm, SwiGLU, rotary embeddings -----------------------

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(dim, context, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.outer(torch.arange(context).float(), freqs)
    return torch.cos(angles), torch.sin(angles)


def apply_rotary(x, cos, sin):
    # In float32, back in x's dtype (as Meta's LLaMA does with type_as).
    xf = x.float()
    x1, x2 = xf[..., 0::2], xf[..., 1::2]
    t = x.shape[-2]
    c, s = cos[:t], sin[:t]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).type_as(x)


class LlamaBlock(nn.Module):
    def __init__(self, d, heads, hidden, kv_heads=None):
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads or heads
        self.attention_norm = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d // heads * self.kv_heads, bias=False)
        self.wv = nn.Linear(d, d // heads * self.kv_heads, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d)
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.attention_norm(x)
        shape, kv = (b, t, self.heads, d // self.heads), (b, t, self.kv_heads, d // self.heads)
        q = apply_rotary(self.wq(h).view(shape).transpose(1, 2), cos, sin)
        k = apply_rotary(self.wk(h).view(kv).transpose(1, 2), cos, sin)
        v = self.wv(h).view(kv).transpose(1, 2)
        if self.kv_heads != self.heads:  # grouped-query attention
            k = torch.repeat_interleave(k, self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.softmax(dim=-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, vocab=96, d=32, heads=4, hidden=64, layers=2, context=16, kv_heads=None):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, heads, hidden, kv_heads) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)
        cos, sin = rotary_tables(d // heads, context)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, ids):
        x = self.tok_embeddings(ids)
        for layer in self.layers:
            x = layer(x, self.rope_cos, self.rope_sin)
        return self.output(self.norm(x))


def GQA():
    """Grouped-query attention (Mistral / LLaMA-2-70B style): 4 query heads
    share 2 key/value heads, repeated with repeat_interleave."""
    return Llama(kv_heads=2)


# --- A small conv net with BatchNorm buffers ---------------------------------

class ConvNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.max_pool2d(x, 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


# --- Initialization through views, in-place ops, .data and re-assignment ----

class ViewInit(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)
        with torch.no_grad():
            self.a.weight[:, :2].zero_()            # write through a slice view
            self.a.weight[3].fill_(0.5)            # through a select view
            self.a.weight.diagonal().add_(1.0)     # through a strided view
            self.b.weight.t()[1:3].mul_(2.0)       # view of a view
            self.a.bias.data = torch.arange(8.0)   # .data assignment
        self.b.bias = nn.Parameter(torch.randn(4) * 0.1)   # re-assigned parameter
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0, 4.0]))
        nn.init.kaiming_uniform_(self.b.weight, a=math.sqrt(5))
        nn.init.trunc_normal_(self.a.weight[4:], std=0.02)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.scale


# A causal decoder written as models are written for torch 2.x:
# F.scaled_dot_product_attention(is_causal=True, enable_gqa=True) with fewer
# key/value heads than query heads, nn.RMSNorm and a SwiGLU feed-forward
# (test_modern_decoder.py trains it; the GPU check runs its training step).
DECODER_DIM, DECODER_HEADS, DECODER_KV_HEADS, DECODER_HIDDEN = 32, 4, 2, 64
DECODER_VOCAB, DECODER_LAYERS = 64, 2


class DecoderAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = DECODER_DIM // DECODER_HEADS
        self.wq = nn.Linear(DECODER_DIM, DECODER_HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(DECODER_DIM, DECODER_KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(DECODER_DIM, DECODER_KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(DECODER_HEADS * self.head_dim, DECODER_DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class DecoderSwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DECODER_DIM, DECODER_HIDDEN, bias=False)
        self.w3 = nn.Linear(DECODER_DIM, DECODER_HIDDEN, bias=False)
        self.w2 = nn.Linear(DECODER_HIDDEN, DECODER_DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.RMSNorm(DECODER_DIM, eps=1e-6)
        self.attention = DecoderAttention()
        self.ffn_norm = nn.RMSNorm(DECODER_DIM, eps=1e-6)
        self.feed_forward = DecoderSwiGLU()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(DECODER_VOCAB, DECODER_DIM)
        self.layers = nn.ModuleList(DecoderBlock() for _ in range(DECODER_LAYERS))
        self.norm = nn.RMSNorm(DECODER_DIM, eps=1e-6)
        self.output = nn.Linear(DECODER_DIM, DECODER_VOCAB, bias=False)

    def forward(self, ids):
        h = self.tok_embeddings(ids)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))
