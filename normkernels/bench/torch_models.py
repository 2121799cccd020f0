"""Whole models for ``bench --via torch``'s training steps, built from torch.nn alone
(no torchvision): ResNet-50 (v1.5, 53 BatchNorm2d) and a BERT-base encoder (an
embedding LayerNorm and 12 post-norm layers of width 768, 12 heads, 3072 inner:
25 LayerNorms), each with a classification head."""


def resnet50(num_classes=1000):
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, c_in, width, stride):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(True), nn.Conv2d(width, 4 * width, 1, bias=False),
                nn.BatchNorm2d(4 * width))
            self.down = None
            if stride != 1 or c_in != 4 * width:
                self.down = nn.Sequential(nn.Conv2d(c_in, 4 * width, 1, stride, bias=False),
                                          nn.BatchNorm2d(4 * width))
            self.relu = nn.ReLU(True)

        def forward(self, x):
            skip = x if self.down is None else self.down(x)
            return self.relu(self.body(x) + skip)

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
              nn.MaxPool2d(3, 2, 1)]
    c_in = 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = 64 << stage
        for block in range(blocks):
            layers.append(Bottleneck(c_in, width, 2 if stage and not block else 1))
            c_in = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)]
    return nn.Sequential(*layers)


def bert_base(vocab=30522, seq=128, num_classes=2):
    import torch
    from torch import nn

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(vocab, 768)
            self.positions = nn.Parameter(torch.zeros(seq, 768))
            self.norm = nn.LayerNorm(768, eps=1e-12)
            layer = nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
                                               batch_first=True, layer_norm_eps=1e-12)
            self.encoder = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)
            self.head = nn.Linear(768, num_classes)

        def forward(self, ids):
            h = self.norm(self.tokens(ids) + self.positions)
            return self.head(self.encoder(h)[:, 0])

    return Bert()


def count_norms(model):
    from torch import nn

    kinds = (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
    return sum(isinstance(m, kinds) for m in model.modules())
