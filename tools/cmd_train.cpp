// gpufeed train: a ResNet on an ImageFolder, fed by gpufeed, with per-epoch reports.
#include <cstdarg>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "gpufeed/harness/trainer.h"

namespace gpufeed::tools {
namespace {

// printf-style formatting: fmt is off limits in torch translation units (see CMakeLists.txt).
std::string format(const char* f, ...) {
  char buf[512];
  va_list args;
  va_start(args, f);
  std::vsnprintf(buf, sizeof buf, f, args);
  va_end(args);
  return buf;
}

}  // namespace

Run add_train(CLI::App& app) {
  auto o = std::make_shared<harness::TrainOptions>();
  auto data = std::make_shared<std::string>();
  auto val = std::make_shared<std::string>();
  auto ckpt = std::make_shared<std::string>();
  app.add_option("--data", *data, "training ImageFolder root")->required();
  app.add_option("--val-data", *val, "validation ImageFolder root (same classes)");
  app.add_option("--arch", o->arch, "resnet18, resnet34, resnet50, resnet101, resnet152")->capture_default_str();
  app.add_option("--epochs", o->epochs)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o->batch_size)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", o->lr, "learning rate per 256 images (scaled by batch size / 256)")->capture_default_str();
  app.add_option("--momentum", o->momentum)->capture_default_str();
  app.add_option("--weight-decay", o->weight_decay)->capture_default_str();
  app.add_option("--warmup-epochs", o->warmup_epochs, "linear LR warmup, epochs")->capture_default_str();
  app.add_option("--workers", o->workers, "loader threads (0 = all)")->capture_default_str();
  app.add_option("--image-size", o->image_size, "train crop side, pixels")->capture_default_str();
  app.add_option("--device", o->device, "cpu or cuda:N")->capture_default_str();
  app.add_flag("--channels-last", o->channels_last, "model and inputs in channels_last");
  app.add_option("--seed", o->seed)->capture_default_str();
  app.add_option("--prefetch-depth", o->prefetch_depth, "loader batch slots")->capture_default_str();
  app.add_option("--checkpoint", *ckpt, "write the final state_dict here (torch.load-able)");
  app.add_option("--max-steps-per-epoch", o->max_steps_per_epoch, "0 = whole epoch")->capture_default_str();
  return [o, data, val, ckpt] {
    o->data = *data;
    if (!val->empty()) o->val_data = *val;
    if (!ckpt->empty()) o->checkpoint = *ckpt;
    harness::Trainer trainer(*o);
    std::cout << format("train: %s on %s, %lld classes, batch %lld, lr %.4g (%g per 256)\n",
                        o->arch.c_str(), o->device.c_str(),
                        static_cast<long long>(trainer.num_classes()),
                        static_cast<long long>(o->batch_size), trainer.scaled_lr(), o->lr)
              << std::flush;
    trainer.fit([&](const harness::EpochStats& s) {
      std::string line = format(
          "epoch %lld/%lld  loss %.4f  top1 %.1f%%  images/s %.1f  data_wait %.1f%%  lr %.4g  "
          "time %.1fs",
          static_cast<long long>(s.epoch + 1), static_cast<long long>(o->epochs), s.loss,
          100 * s.top1, s.images_per_s, 100 * s.data_wait_fraction, s.lr, s.seconds);
      if (s.val_top1) {
        line += format("  val_loss %.4f  val_top1 %.1f%%  val_top5 %.1f%%", *s.val_loss,
                       100 * *s.val_top1, 100 * *s.val_top5);
      }
      std::cout << line << "\n" << std::flush;
    });
    if (o->checkpoint) std::cout << "checkpoint: " << o->checkpoint->string() << "\n";
    return 0;
  };
}

}  // namespace gpufeed::tools
