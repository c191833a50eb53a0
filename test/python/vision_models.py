"""torchvision classification models and torch.nn Transformer modules in
small configurations (random weights, nothing downloaded): the models the
real-model tests and benchmarks run, written as their users write them."""

import torch
import torch.nn as nn
import torchvision
from torchvision.models import convnext, efficientnet, resnet, swin_transformer, vision_transformer


def resnet18_small(classes=10):
    return resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=classes)


def mobilenet_v3_small(classes=10):
    return torchvision.models.mobilenet_v3_small(num_classes=classes)


def efficientnet_small(classes=10):
    settings, last = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25,
                                                     depth_mult=0.25)
    return efficientnet.EfficientNet(settings, 0.2, num_classes=classes, last_channel=last)


def convnext_small(classes=10):
    block = convnext.CNBlockConfig
    return convnext.ConvNeXt([block(16, 32, 1), block(32, None, 1)], num_classes=classes)


def vit_small(classes=10):
    return vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=classes)


def swin_small(classes=10):
    return swin_transformer.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
        num_classes=classes)


class EncoderClassifier(nn.Module):
    """torch.nn.TransformerEncoder over embedded tokens, mean-pooled."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, classes=10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0,
                                           batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


class Seq2Seq(nn.Module):
    """torch.nn.Transformer (encoder and decoder) with a causal target mask."""

    def __init__(self, vocab=64, d=32, heads=4, classes=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.transformer = nn.Transformer(d, heads, num_encoder_layers=1, num_decoder_layers=1,
                                          dim_feedforward=64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d, classes)

    def forward(self, src, tgt):
        t = tgt.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        # tgt_is_causal says what the mask is: left None, torch 2.x compares
        # the mask with a causal one (its values) to find out, which a fake
        # tensor cannot answer (tdx names the line).
        return self.head(self.transformer(self.embed(src), self.embed(tgt), tgt_mask=mask,
                                          tgt_is_causal=True))


IMAGES = {"resnet18": resnet18_small, "mobilenet_v3": mobilenet_v3_small,
          "efficientnet": efficientnet_small, "convnext": convnext_small, "vit": vit_small,
          "swin": swin_small}


def resnet_tiny(classes=10):
    """torchvision's ResNet stem and BasicBlocks at widths 16 and 32 (20k
    parameters): a conv net's training ops (convolutions with and without
    stride, batch norm in training, ReLU, max pooling, a downsampling
    shortcut) at a size the GPU check carries."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(3, 2, 1),
        resnet.BasicBlock(16, 16),
        resnet.BasicBlock(16, 32, stride=2, downsample=torch.nn.Sequential(
            resnet.conv1x1(16, 32, 2), torch.nn.BatchNorm2d(32))),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, classes))
