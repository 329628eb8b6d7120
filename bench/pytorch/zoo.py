"""gradwire's model zoo (models/) written in PyTorch: the peers of bench/pytorch/models_bench.py
and the source of models/tests' reference data (models/tests/make_reference_zoo.py).

Same layers, shapes, parameter names and state-dict keys as gradwire's models:
  TutorialCnn     PyTorch's parameter-server tutorial Net: conv(1,32,3) relu conv(32,64,3)
                  maxpool2 dropout2d(0.25) flatten linear(9216,128) relu dropout(0.5)
                  linear(128,10) log_softmax (the tutorial's second Dropout2d acts on
                  [N, 128], i.e. element-wise: Dropout here)
  SmallResNet     stem conv3x3(1,16)+BN+ReLU, 3 stages of 2 basic blocks (16, 32, 64
                  channels, stride 2 between stages, 1x1 conv + BN shortcuts), adaptive
                  avg pool, linear(64,10)
  LstmClassifier  2-layer LSTM over the image rows (input 28, hidden 128, 28 steps,
                  batch_first), linear(128,10) on the last step's output
  SmallViT        4x4 patches (49 tokens) -> linear(16,128) + learned positions, 4 pre-norm
                  encoder layers (d 128, 4 heads, feed-forward 256, GELU, dropout 0.1),
                  layer norm, mean over tokens, linear(128,10)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class TutorialCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv2(F.relu(self.conv1(x)))
        x = self.dropout1(F.max_pool2d(x, 2))
        x = self.dropout2(F.relu(self.fc1(torch.flatten(x, 1))))
        return F.log_softmax(self.fc2(x), dim=1)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        blocks, cin = [], 16
        for cout, stride in [(16, 1), (16, 1), (32, 2), (32, 1), (64, 2), (64, 1)]:
            blocks.append(BasicBlock(cin, cout, stride))
            cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class LstmClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 128, num_layers=2, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        out, _ = self.lstm(x.reshape(-1, 28, 28))
        return self.fc(out[:, -1])


class SmallViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Linear(16, 128)
        self.pos = nn.Parameter(torch.zeros(1, 49, 128))
        nn.init.normal_(self.pos, std=0.02)
        layer = nn.TransformerEncoderLayer(128, 4, 256, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4)
        self.norm = nn.LayerNorm(128)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        n = x.shape[0]
        # [N, 1, 28, 28] -> [N, 7, 4, 7, 4] -> [N, 7, 7, 4, 4] -> [N, 49, 16]
        p = x.reshape(n, 7, 4, 7, 4).permute(0, 1, 3, 2, 4).reshape(n, 49, 16)
        h = self.encoder(self.patch(p) + self.pos)
        return self.head(self.norm(h).mean(dim=1))


MODELS = {"cnn": TutorialCnn, "resnet": SmallResNet, "lstm": LstmClassifier, "vit": SmallViT}
