#pragma once
// Multi-crop views (DINO, DINOv2): K crops of one source image, each with its own
// RandomResizedCrop, interpolation, flip and augmentation chain, made from a single decode.
//
// Randomness: view k of sample `index` in `epoch` draws from SampleRng(seed, epoch, index, k),
// the sample's Philox stream with k in the counter's second word (transform.h). View 0's stream is
// the single-view transform's, so a one-view description plans exactly what plan_sample plans for
// the same RandomResizedCrop, flip and interpolation. A view's draws depend on nothing but
// (seed, epoch, index, k) and its own options: not on the thread, nor on the other views.
//
// Decode: the union (bounding box) of the views' boxes, once, at the finest DCT scale any view
// needs (decode::choose_scale per view, the largest numerator). Each view is then resampled from
// its own part of that decode, taps stopping at its box as torchvision's crop-then-resize does.
// When the union is one view's box at that view's own scale (one view; or boxes that coincide),
// the view's pixels are byte-equal to the single-view path (decode_options_for + resize_sample +
// apply_augment). Otherwise a view decoded at a finer scale than it alone needs resamples more
// pixels, and a JPEG's chroma upsampling near a crop edge may differ from a decode cropped to
// that view alone.
//
// When decoding views separately is cheaper (decode_views_separately): small crops far apart in a
// large image make the union mostly pixels no view uses, and force the finest view's scale on
// them. The choice is by decode_cost, a model of libjpeg-turbo's time: Huffman decoding of every
// row down to the crop's bottom, whole rows (libjpeg cannot skip entropy data; jpeg_skip_scanlines
// and jpeg_crop_scanline save only the IDCT, upsampling and colour conversion), plus those for
// the crop's own pixels at its scale. Each separate decode repeats the entropy decoding of the
// rows above its crop, so with DINO's 10 views the union always wins; with two small crops at the
// top and the bottom of a large image the separate decodes do. Then each view is decoded as the
// single-view path decodes it (decode_options_for, resize_sample): byte-equal to it.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpufeed/decode/decoder.h"
#include "gpufeed/transforms/augment.h"
#include "gpufeed/transforms/resize.h"
#include "gpufeed/transforms/transform.h"

namespace gpufeed::transforms {

/// One view: torchvision's RandomResizedCrop(size, scale, ratio, interpolation), then
/// RandomHorizontalFlip(flip_probability), then its augmentations (AugmentOptions' order).
/// Output [size, size, 3] uint8.
struct ViewOptions {
  RandomResizedCropOptions rrc{};  ///< output side, scale and ratio ranges
  ResizeFilter interpolation = ResizeFilter::kBilinear;
  float flip_probability = 0.5f;  ///< [0, 1]
  AugmentOptions augment{};       ///< this view's own chain
  /// Throws std::invalid_argument naming the field, its value and the accepted range:
  /// size >= 1, 0 < scale_min <= scale_max, 0 < ratio_min <= ratio_max, flip in [0, 1], and
  /// AugmentOptions::validate().
  void validate() const;
};

/// K >= 1 views of every sample, in order (DINO: 2 global crops, then the local ones).
struct ViewsOptions {
  std::vector<ViewOptions> views;
  /// The preset these views came from (views_preset), for display and the option schema; empty
  /// for views described one by one (views_from_rows).
  std::string preset;
  /// views_preset's local_crops_number (-1: the preset's own); kept so the schema can rebuild it.
  int local_crops_number = -1;
  bool empty() const { return views.empty(); }
  /// Throws std::invalid_argument for no views, or naming the view (its index) that is invalid.
  void validate() const;
};

/// The view the train transform `t` describes: its rrc, interpolation, flip_probability and
/// augment. Throws std::invalid_argument for an eval transform.
ViewOptions view_of(const TransformOptions& t);
/// The train transform that describes view `v` (view_of's inverse).
TransformOptions transform_of(const ViewOptions& v);

/// The keywords a view is written with, transform_options_schema()'s names less "train" and
/// "resize_size": image_size, scale, ratio, interpolation, hflip_p and the augmentations'.
const std::vector<std::string>& view_keywords();

/// Views described one by one, each a map of view_keywords() to values applied, as the
/// transform's schema applies them, over the default train transform (RandomResizedCrop(224),
/// bilinear, flip 0.5, no augmentation). Throws options::OptionError naming the view (its index)
/// and the keyword for an unknown or refused keyword; std::invalid_argument for no rows.
ViewsOptions views_from_rows(const std::vector<std::map<std::string, options::Value>>& rows);
/// Every view's view_keywords() and values (views_from_rows(views_to_rows(v)) == v's views).
std::vector<std::map<std::string, options::Value>> views_to_rows(const ViewsOptions& views);

/// The presets' names: "dino", "dinov2", "dinov2_paper".
const std::vector<std::string>& views_preset_names();

/// A self-supervised recipe's views: 2 global crops (224 px) then `local_crops_number` local crops
/// (96 px; -1 = the recipe's 8), all bicubic, each with RandomHorizontalFlip(0.5),
/// RandomApply(ColorJitter(0.4, 0.4, 0.2, 0.1), p=0.8) and RandomGrayscale(0.2), a GaussianBlur
/// (kernel 9, sigma 0.1..2.0) with a per-view probability, and RandomSolarize(128, p=0.2) on the
/// second global crop:
///   "dino"          facebookresearch/dino main_dino.py DataAugmentationDINO, its defaults: global
///                   scale (0.4, 1), local (0.05, 0.4); blur p 1.0 / 0.1 / 0.5 (global 1 / 2 /
///                   local). DINO blurs with PIL's GaussianBlur(radius); gpufeed with torchvision's
///                   GaussianBlur(9, sigma), the kernel DINOv2 uses for the same radius range.
///   "dinov2"        facebookresearch/dinov2 data/augmentations.py as its code runs: global scale
///                   (0.32, 1), local (0.05, 0.32); its GaussianBlur(p) hands 1 - p to RandomApply,
///                   so the blur probabilities in force are 0.0 / 0.9 / 0.5.
///   "dinov2_paper"  the same with the probabilities its code writes and the paper states:
///                   1.0 / 0.1 / 0.5.
/// Throws std::invalid_argument naming the presets for another name, or for local_crops_number
/// outside [-1, 64].
ViewsOptions views_preset(std::string_view name, int local_crops_number = -1);

/// Plans view `view` (its index in ViewsOptions::views) of sample `index` in `epoch` for a
/// width x height source: plan_sample's train plan (box, region, flip, filter, output size, and
/// the stream the augmentations continue), drawn from SampleRng(seed, epoch, index, view).
/// Pure function of its arguments.
SamplePlan plan_view(const ViewOptions& options, int width, int height, uint64_t seed,
                     int64_t epoch, int64_t index, int view);

/// plan_view for every view, into `plans` (resized to K; reuses its capacity).
void plan_views(const ViewsOptions& options, int width, int height, uint64_t seed, int64_t epoch,
                int64_t index, std::vector<SamplePlan>& plans);

/// The one decode of a sample with header `info` for `plans`: `base`'s limits and error policy,
/// the crop the bounding box of the plans' boxes, the scale the largest numerator of
/// choose_scale(info, box_k, size_k, size_k) over the views. Throws std::invalid_argument for
/// no plans.
decode::DecodeOptions decode_options_for_views(std::span<const SamplePlan> plans,
                                               const decode::ImageInfo& info,
                                               const decode::DecodeOptions& base);

/// Resizes view `plan` out of `image`, a decode whose result is `result` and whose crop contains
/// plan.box (decode_options_for_views), into `out` ([S, S, 3] uint8, S = plan.output_size),
/// mirrored when plan.flip. The view sees the decoded pixels of its own box at that scale,
/// [floor(x * s), ceil((x + width) * s)) scaled columns (s = scale.num / 8; rows alike), which
/// are the pixels a decode cropped to the box alone returns; its taps stop there. Throws
/// std::invalid_argument when the image does not match the result or the box is not inside it.
void resize_view(const SamplePlan& plan, const decode::DecodeResult& result,
                 const decode::ImageBuffer& image, Resizer& resizer, uint8_t* out);

/// The model's CPU cost of a decode with options `d` of the JPEG with header `info`, in units of
/// one whole-image decode at 8/8 (decode::scale_cost's unit), per source pixel:
///   kEntropyShare * width * min(height, crop bottom)        (entropy decoding; whole image for
///                                                             progressive JPEGs)
///   + (scale_cost(d.scale) - kEntropyShare) * crop area      (IDCT, upsampling, colour)
/// all over width * height. kEntropyShare = 0.7: a 1/8 decode costs 0.76 (scale_cost), and its
/// IDCT and colour conversion make 1/64 of the pixels, so nearly all of that is entropy decoding.
double decode_cost(const decode::ImageInfo& info, const decode::DecodeOptions& d);
inline constexpr double kEntropyShare = 0.7;

/// Whether the views `plans` of a source with header `info` decode more cheaply one by one
/// (decode_options_for each) than as one union decode (decode_options_for_views): the sum of
/// their decode_cost below 0.9 x the union's. False for other formats than JPEG (they decode
/// whole either way) and for one plan.
bool decode_views_separately(std::span<const SamplePlan> plans, const decode::ImageInfo& info,
                             const decode::DecodeOptions& base);

/// Per-thread state of decode_views_into, reused from sample to sample.
struct ViewsWorker {
  decode::Decoder decoder;
  decode::ImageBuffer image;
  Resizer resizer;
  std::vector<SamplePlan> plans;
  AugmentPlan augment;
  AugmentScratch scratch;
  /// Decoder::decode calls made by decode_views_into (the only place it decodes): one per sample,
  /// or one per view for the samples decode_views_separately decodes view by view.
  int64_t decodes = 0;
  /// Nanoseconds decode_views_into spent probing, planning and decoding (steady clock), summed;
  /// the rest of its time is the views' resizes and augmentations.
  int64_t decode_ns = 0;
};

/// Sample `index` of `epoch` (the file in `bytes`, named `source` in errors) into K outputs:
/// probe, plan_views (in the frame the decoder returns: displayed when base applies the EXIF
/// orientation), one decode with decode_options_for_views, then per view resize_view into
/// outs[k] and its augmentations (plan_augment + apply_augment continuing the view's stream).
/// Where decode_views_separately says so, each view is decoded on its own instead
/// (decode_options_for + resize_sample, the single-view path). `options` must be valid. Throws
/// std::invalid_argument when outs.size() != K; DecodeError as Decoder::decode. Returns the union
/// decode's options (the union crop and the scale), whichever way it decoded.
decode::DecodeOptions decode_views_into(std::span<const uint8_t> bytes, std::string_view source,
                                        const ViewsOptions& options,
                                        const decode::DecodeOptions& base, uint64_t seed,
                                        int64_t epoch, int64_t index,
                                        std::span<uint8_t* const> outs, ViewsWorker& worker);

}  // namespace gpufeed::transforms
